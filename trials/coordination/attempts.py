"""The database side of a trial's attempts: end them, confirm them gone, ask them to stop.

Every process of an attempt has a ``storage.TrialProcess`` row (written and ended by
its executor: :mod:`trials.executors._process_rows`). A row's ``ended_at`` is set only
when a process is confirmed gone, and a run's ``ended_at`` only when all of its
processes are. These facts are what let any
later driver act safely after a crash:

- :func:`end_run` ends every leftover process of a run (recorded pids, checked
  against their kernel start time, plus anything carrying the run's launch token)
  before the trial's next attempt starts, so two attempts never overlap;
- :func:`trial_processes_gone` tells the slot ledger whether an expired lease may be
  released, so a slot is never given to a second trial while the first still runs
  on it, or may still start on it (a run recorded by a driver that was stopped
  before it started the run's processes).

Both read the runs they judge locked, in the transaction that then ends them or frees
their slots; a run's ranks mark it started (``storage.start_ranks``) only while it is
not ended and its claim holds. So either the ranks committed first, and the run is
judged by its processes, or the judgement did, and the ranks exit before touching a
device.

Example:
    >>> from storage import TrialRun, session_scope
    >>> with session_scope(url) as session:
    ...     run = TrialRun(trial_id=1, attempt=0, launch_token="t-1-0")
    ...     session.add(run)
    ...     session.flush()
    ...     end_run(session, run, reason="driver stopped")  # no process of it is left
    True
    >>> run.ended_at is not None, run.reason
    (True, 'driver stopped')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from storage import (
    Allocation,
    Experiment,
    Trial,
    TrialProcess,
    TrialRun,
    WarmJob,
    utcnow,
)
from trials.executors import executor_named
from trials.launch.processes import is_local_host, pid_running

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def end_run(
    session: Session, run: TrialRun, *, reason: str | None = None, grace_s: float = 0.0
) -> bool:
    """End every process of ``run`` through the executor that started it; whether all are gone.

    When none is left the run itself is marked ended (``ended_at``, and ``reason`` if
    the run had none); otherwise it stays open and False is returned.
    """
    if run.ended_at is None:
        if not executor_named(run.executor).end_leftovers(session, run, grace_s=grace_s):
            return False
        run.ended_at = utcnow()
        if reason and not run.reason:
            run.reason = reason
    return True


def trial_processes_gone(session: Session, trial_id: int) -> bool:
    """Whether no process of any attempt of ``trial_id`` runs (confirmed, not assumed)."""
    # Locked before they are judged (PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` serialises
    # anyway): a rank marking its run started (``storage.start_ranks``) either committed
    # first, and the run is judged started, or waits for this judgement and then sees
    # the claim gone.
    runs = list(
        session.scalars(select(TrialRun).where(TrialRun.trial_id == trial_id).with_for_update())
    )
    # A warm job holding the trial's slots runs the processes of its newest run, whichever
    # trial that was (an idle job reserved for this trial has run none of it yet).
    jobs = select(Allocation.warm_job_id).where(
        Allocation.trial_id == trial_id, Allocation.warm_job_id.is_not(None)
    )
    tokens = select(WarmJob.launch_token).where(WarmJob.id.in_(jobs), WarmJob.ended_at.is_(None))
    for token in session.scalars(tokens):
        newest = session.scalars(
            select(TrialRun).where(TrialRun.launch_token == token).order_by(TrialRun.id.desc())
        ).first()
        if newest is not None and newest not in runs:
            runs.append(newest)
    gone = True
    for run in runs:
        if _may_still_start(session, run) or not executor_named(run.executor).leftovers_gone(
            session, run
        ):
            gone = False
    return gone


def _may_still_start(session: Session, run: TrialRun) -> bool:
    """Whether ``run`` is recorded, not started, and its driver may still start it.

    A driver records a run (its claim checked) before it starts the run's processes.
    Stopped in between (SIGSTOP, a suspended machine) for longer than its lease, it
    starts them once continued, whatever happened meanwhile; none of them exists yet,
    so no executor can see them. Until the run's processes are recorded (pids, or the
    executor's own id) only a driver confirmed gone means they never start: none owns
    the experiment, or its pid no longer runs on this machine. A driver on another
    host cannot be checked from here; its run keeps its slots until a resume ends it.
    """
    if run.ended_at is not None or run.external_id is not None:
        return False
    if run.ranks_started_at is not None:
        return False  # started: gone only once its executor finds its processes gone
    started = session.scalar(select(TrialProcess.id).where(TrialProcess.run_id == run.id).limit(1))
    if started is not None:
        return False
    driver = session.execute(
        select(Experiment.driver_host, Experiment.driver_pid)
        .join(Trial, Trial.experiment_id == Experiment.id)
        .where(Trial.id == run.trial_id)
    ).first()
    if driver is None or driver.driver_pid is None:
        return False
    if driver.driver_host is None or not is_local_host(driver.driver_host):
        return True
    return pid_running(driver.driver_pid)


def request_stop(session: Session, run: TrialRun) -> None:
    """Ask ``run`` to checkpoint and stop: rank 0 reads it with its next record."""
    if run.stop_requested_at is None:
        run.stop_requested_at = utcnow()


def open_runs(session: Session, trial_id: int) -> list[TrialRun]:
    """The runs of ``trial_id`` not yet confirmed ended, oldest first.

    Locked (PostgreSQL) for the caller's transaction, which may end them: a rank
    marking one started (``storage.start_ranks``) commits before this reads it, and
    then ending the run finds its processes, or waits and then finds the run ended.
    """
    return list(
        session.scalars(
            select(TrialRun)
            .where(TrialRun.trial_id == trial_id, TrialRun.ended_at.is_(None))
            .order_by(TrialRun.attempt)
            .with_for_update()
        )
    )
