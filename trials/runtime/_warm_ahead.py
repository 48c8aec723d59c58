"""Rank 0 starts its warm job's next trial itself, when the driver decided it ahead.

While a warm job runs a trial, its driver may decide the job's next trials ahead
(``searcher.driver.handoff``; two at most): under the placement decision's usual rule for an
idle job (:func:`storage.contesting_trial`: its search's next trial of its shape, unless
a trial of another shape waits at the same or a higher priority) it writes them on the
job's row in order, the first one's id in ``WarmJob.ahead_trial_id`` and each one's
prepared start in ``WarmJob.ahead`` (the trial, the priority it was decided at, a claim
token, the log path, the runtime spec). At the hand-back rank 0 calls :func:`take_ahead`
in the same transaction that ends the job's trial. If the decision for the first still
stands, that trial starts at once, with the rows the driver's hand-over would write,
and the next moves up (its decision is checked when its turn comes); else rank 0
clears them all and hands the job back, and the driver decides, as without a
reservation. The decision stands while:

- the experiment is active, no pause or kill is requested and its driver heartbeats;
- the job's trial was not asked to stop (a pause, a preemption) and the job not to end;
- the trial still waits (QUEUED, never started, not placed by a decision) and no
  trial of another shape waits in the pool at the same or a higher priority (one that
  arrived since the driver decided: another search's, a larger one of this search);
- the ledger still holds all of the job's slots (counted once they are moved to the
  trial's claim, so that a driver reclaiming them meanwhile on PostgreSQL is seen; the
  start is then rolled back).

The start needs no fence of its own (the driver's hand-over passes
``storage.start_ranks``): the run is created, its claim given the job's slots and its
ranks marked started in the transaction that checked the decision, so no judgement of
the run can come between. The driver sees the job running the trial at its next look
and adopts it (``searcher.driver.running.RunningTrials``).

Rank 0 of a warm job calls it in its hand-back (a database and a job's rows are
needed, so no example runs here)::

    with session_scope(url) as session:
        spec = take_ahead(session, job, finished_trial_id=7, driver_lease_s=30.0)
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import WarmJob


def take_ahead(
    session: Session, job: WarmJob, *, finished_trial_id: int, driver_lease_s: float
) -> dict[str, Any] | None:
    """Start the first trial decided ahead on ``job`` if the decision stands; its spec, else None.

    Runs in rank 0's hand-back transaction, ``job`` read (locked) in it and still running
    ``finished_trial_id``. Started, the next trial decided ahead becomes the first;
    refused, every one is cleared and waits in its driver's queue for an ordinary
    decision.
    """
    from storage import TrialRun

    chain, trial_id = list(job.ahead or ()), job.ahead_trial_id
    job.ahead = job.ahead_trial_id = None
    if not chain or trial_id is None or chain[0]["trial_id"] != trial_id:
        return None
    ahead, rest = chain[0], chain[1:]
    if not _decision_stands(session, job, trial_id, ahead, driver_lease_s=driver_lease_s):
        return None
    finished = session.get(TrialRun, job.current_run_id) if job.current_run_id else None
    if finished is None or finished.trial_id != finished_trial_id:
        return None
    try:
        with session.begin_nested():
            _start(session, job, finished, trial_id, ahead)
    except _SlotsGone:
        return None
    if rest:
        job.ahead_trial_id, job.ahead = rest[0]["trial_id"], rest
    spec: dict[str, Any] = ahead["spec"]
    return spec


def _decision_stands(
    session: Session, job: WarmJob, trial_id: int, ahead: dict[str, Any], *, driver_lease_s: float
) -> bool:
    """Whether the placement decision would still give ``job`` to ``trial_id`` now."""
    from sqlalchemy import func, select

    from storage import (
        Experiment,
        ExperimentState,
        QueuedTrial,
        Trial,
        TrialRun,
        TrialState,
        contesting_trial,
        utcnow,
    )

    experiment = session.execute(
        select(
            Experiment.state, Experiment.requested_action, Experiment.driver_heartbeat_at
        ).where(Experiment.id == job.experiment_id)
    ).one_or_none()
    if (
        experiment is None
        or experiment.state != ExperimentState.ACTIVE
        or experiment.requested_action is not None
        or experiment.driver_heartbeat_at is None
        or utcnow() - experiment.driver_heartbeat_at >= _dt.timedelta(seconds=driver_lease_s)
    ):
        return False
    stop_asked = session.scalar(
        select(TrialRun.stop_requested_at).where(TrialRun.id == job.current_run_id)
    )
    if stop_asked is not None:
        return False
    # One statement: the trial, whether it ever ran, and whether a decision placed it.
    trial = session.execute(
        select(
            Trial.experiment_id,
            Trial.state,
            Trial.started_at,
            select(func.count())
            .where(TrialRun.trial_id == trial_id)
            .scalar_subquery()
            .label("runs"),
            select(QueuedTrial.placement)
            .where(QueuedTrial.trial_id == trial_id)
            .scalar_subquery()
            .label("placement"),
        ).where(Trial.id == trial_id)
    ).one_or_none()
    if (
        trial is None
        or trial.experiment_id != job.experiment_id
        or trial.state != TrialState.QUEUED
        or trial.started_at is not None
        or trial.runs
    ):
        return False
    if trial.placement is not None:
        return False  # a decision gave it other slots: its driver starts it there
    # The placement decision's rule for an idle warm job, over live drivers' queues.
    contested = contesting_trial(
        session,
        experiment_id=job.experiment_id,
        pool=job.resource_pool,
        slots=job.slots,
        priority=int(ahead["priority"]),
        lease_s=driver_lease_s,
    )
    return contested is None


class _SlotsGone(Exception):
    """The ledger no longer holds all of the job's slots: the start is rolled back."""


def _start(
    session: Session, job: WarmJob, finished: Any, trial_id: int, ahead: dict[str, Any]
) -> Any:
    """Write the trial's first run on ``job``: the rows the driver's hand-over writes.

    The job's slots move to the trial under the reservation's claim token; the job's
    ``torchrun`` rows move to the new run (those of earlier runs end); the trial is
    RUNNING and its ranks started (what ``storage.start_ranks`` would stamp: the caller's
    transaction holds what that checks). The run's executor, agents and external id are
    the job's, as for any run on it.
    """
    from sqlalchemy import delete, update

    from storage import (
        Allocation,
        ProcessRole,
        QueuedTrial,
        Trial,
        TrialProcess,
        TrialRun,
        TrialState,
        claimed_slots,
        end_earlier_processes,
        utcnow,
    )

    now = utcnow()
    run = TrialRun(
        trial_id=trial_id,
        attempt=0,
        executor=finished.executor,
        agents=finished.agents,
        external_id=finished.external_id,
        launch_token=job.launch_token,
        claim_token=ahead["claim_token"],
        spec=ahead["spec"],
        started_at=now,
        ranks_started_at=now,
    )
    session.add(run)
    session.flush()
    trial = session.get(Trial, trial_id)
    assert trial is not None
    trial.state = TrialState.RUNNING
    trial.log_path = ahead["log_path"]
    trial.started_at = now
    session.execute(delete(QueuedTrial).where(QueuedTrial.trial_id == trial_id))
    session.execute(
        update(Allocation)
        .where(Allocation.warm_job_id == job.id)
        .values(trial_id=trial_id, claim_token=ahead["claim_token"])
    )
    # Counted after the move, not before: on PostgreSQL a driver reclaiming the job's
    # slots may commit between a look and the move, which then takes only what is left.
    if claimed_slots(session, trial_id, ahead["claim_token"]) != job.slots:
        raise _SlotsGone
    # The job's torchrun processes go on as the new run's.
    for row in end_earlier_processes(session, job, run):
        if row.role == ProcessRole.TORCHRUN and row.run_id == finished.id:
            session.add(
                TrialProcess(
                    run_id=run.id,
                    trial_id=trial_id,
                    attempt=run.attempt,
                    role=ProcessRole.TORCHRUN,
                    agent=row.agent,
                    host=row.host,
                    slots=row.slots,
                    pid=row.pid,
                    create_time=row.create_time,
                )
            )
    job.current_trial_id = trial_id
    job.current_run_id = run.id
    job.trials_run = job.trials_run + 1
    job.reserved_trial_id = job.next_run_id = None
    job.next_spec = None
    job.idle_since = None
    return run
