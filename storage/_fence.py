"""Attempt fencing: only a trial's current attempt may write what the trial recorded.

A driver that restarts a trial (a crash, a hang, a resume after the driver died) adds a
``TrialRun`` with the next attempt number; one that gives up on a run sets its
``ended_at``. Processes of the older attempt may still be alive (an orphaned rank), and
whatever they write would mix into the new attempt's timeline: metrics, timings, a
result, checkpoints, and worst, retention deleting the checkpoint the new attempt is
restoring from. So every transaction a rank commits starts with :func:`claim_attempt`,
which refuses it when the attempt has been superseded and otherwise stamps the run's
progress (the driver's hang detection reads ``progress_at``).

Before any of that, before a rank touches a device or builds a model, its run passes
:func:`start_ranks` (once per node, by the node's ``torchrun`` wrapper before it
starts the ranks; a rank started otherwise checks for itself): the run is not ended
and the slot claim it was launched on still holds, and the run is marked started, all
in one transaction. A driver stopped between recording a run and starting its
processes may have lost the claim meanwhile (another driver, or a resume, judged the
run gone and gave the slots to another trial); its ranks then exit at once (or never
start) with :data:`FENCED_EXIT_CODE`. Whoever judges a run gone reads
the row in its own write transaction, locked: either the ranks' check committed first
(the run is marked started, and is gone only once its processes are) or the judgement
did (the ranks see the run ended or the claim gone).
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from storage._models import Allocation, TrialRun, utcnow

FENCED_EXIT_CODE = 4
"""A rank's (and its ``torchrun``'s) exit code when :func:`start_ranks` refused the run:
nothing ran, no failure; the driver queues the trial again without counting a restart."""


class AttemptSupersededError(RuntimeError):
    """This attempt of the trial is no longer the one that may record anything."""

    def __init__(self, trial_id: int, attempt: int, latest: int, ended: bool) -> None:
        self.trial_id = trial_id
        self.attempt = attempt
        self.latest = latest
        if ended:
            message = (
                f"attempt {attempt} of trial {trial_id} was ended by the driver; "
                "stopping without recording"
            )
        else:
            message = (
                f"attempt {attempt} of trial {trial_id} was superseded by attempt {latest}; "
                "stopping without recording"
            )
        super().__init__(message)


def claim_attempt(
    session: Session, trial_id: int, attempt: int, *, progress: bool = True
) -> int | None:
    """Check that ``attempt`` still owns ``trial_id`` and record its progress; its run id.

    ``progress=False`` only checks: a writer whose writes do not mean the training
    advances (the system-metrics sampler) must not hide a hung rank from the driver.

    Call it first in the transaction whose writes it guards: when it raises
    :class:`AttemptSupersededError` the caller's transaction must roll back. The update
    comes before the check so that, on PostgreSQL, it waits for a driver ending this
    run in a concurrent transaction and then sees that run's ``ended_at`` (SQLite's
    ``BEGIN IMMEDIATE`` serialises the two anyway).

    A trial with no run of ``attempt`` or later (a test or a hand-made spec, never a
    driver's launch) is not fenced and has no run to stamp: ``None``.

    Example:
        >>> from storage import MetricKind, record_metrics, session_scope
        >>> with session_scope(url) as session:
        ...     session.add(TrialRun(trial_id=1, attempt=0))
        >>> with session_scope(url) as session:
        ...     claim_attempt(session, trial_id=1, attempt=0)
        ...     record_metrics(session, 1, 100, MetricKind.TRAINING, {"loss": 0.4})
        1
        >>> with session_scope(url) as session:
        ...     session.add(TrialRun(trial_id=1, attempt=1))
        >>> with session_scope(url) as session:
        ...     claim_attempt(session, trial_id=1, attempt=0)
        Traceback (most recent call last):
        ...
        storage._fence.AttemptSupersededError: attempt 0 of trial 1 was superseded by attempt 1; stopping without recording
    """
    if progress:
        session.execute(
            update(TrialRun)
            .where(TrialRun.trial_id == trial_id, TrialRun.attempt == attempt)
            .values(progress_at=utcnow())
        )
    # Uses the unique (trial_id, attempt) index; normally one row, this attempt's own.
    rows = session.execute(
        select(TrialRun.id, TrialRun.attempt, TrialRun.ended_at)
        .where(TrialRun.trial_id == trial_id, TrialRun.attempt >= attempt)
        .order_by(TrialRun.attempt.desc())
    ).all()
    if not rows:
        return None
    latest = rows[0]
    if latest.attempt != attempt or latest.ended_at is not None:
        raise AttemptSupersededError(
            trial_id, attempt, latest.attempt, ended=latest.attempt == attempt
        )
    return int(latest.id)


def stop_requested(session: Session, run_id: int) -> bool:
    """Whether the driver asked run ``run_id`` to checkpoint and stop (pause, preemption).

    The request travels through the database because rank 0 may run on any node of the
    cluster; the driver's disk is not shared with it.
    """
    return (
        session.scalar(select(TrialRun.stop_requested_at).where(TrialRun.id == run_id)) is not None
    )


class RanksFencedError(RuntimeError):
    """The run's ranks may not start: it was ended, or its slot claim is gone."""

    def __init__(self, trial_id: int, attempt: int, why: str) -> None:
        self.trial_id = trial_id
        self.attempt = attempt
        super().__init__(
            f"attempt {attempt} of trial {trial_id} may not start: {why}; "
            "exiting before touching any device"
        )


def start_ranks(session: Session, trial_id: int, attempt: int) -> int | None:
    """Check that attempt ``attempt`` of ``trial_id`` may start its ranks, and mark it started.

    Raises :class:`RanksFencedError` when the run was ended (a driver judged it gone),
    superseded, or the slot claim it was launched on (``TrialRun.claim_token``) no
    longer holds all of its slots; the caller's transaction must then roll back and
    the rank exit with :data:`FENCED_EXIT_CODE`. Returns the run's id, or None for a
    trial with no such run (a hand-made spec: not fenced).

    The update comes first, as in :func:`claim_attempt`: on PostgreSQL it waits for a
    transaction that locked the run to judge it (``SELECT ... FOR UPDATE``) and then
    sees what that one wrote; SQLite's ``BEGIN IMMEDIATE`` serialises the two anyway.

    Example:
        >>> from storage import session_scope
        >>> with session_scope(url) as session:
        ...     session.add(TrialRun(trial_id=1, attempt=0))
        >>> with session_scope(url) as session:
        ...     start_ranks(session, trial_id=1, attempt=0)
        1
        >>> with session_scope(url) as session:
        ...     session.get(TrialRun, 1).ended_at = utcnow()
        >>> with session_scope(url) as session:
        ...     start_ranks(session, trial_id=1, attempt=0)
        Traceback (most recent call last):
        ...
        storage._fence.RanksFencedError: attempt 0 of trial 1 may not start: the run was ended (its driver lost it); exiting before touching any device
    """
    session.execute(
        update(TrialRun)
        .where(
            TrialRun.trial_id == trial_id,
            TrialRun.attempt == attempt,
            TrialRun.ended_at.is_(None),
        )
        # Every rank takes the row's lock; the first one's time stays.
        .values(ranks_started_at=func.coalesce(TrialRun.ranks_started_at, utcnow()))
        .execution_options(synchronize_session=False)
    )
    try:
        run_id = claim_attempt(session, trial_id, attempt, progress=False)
    except AttemptSupersededError as superseded:
        why = (
            "the run was ended (its driver lost it)"
            if superseded.latest == attempt
            else f"it was superseded by attempt {superseded.latest}"
        )
        raise RanksFencedError(trial_id, attempt, why) from None
    if run_id is None:
        return None
    run = session.execute(
        select(TrialRun.claim_token, TrialRun.agents).where(TrialRun.id == run_id)
    ).one()
    if run.claim_token is not None:
        held = claimed_slots(session, trial_id, run.claim_token)
        wanted = sum(len(node.get("slots", [])) for node in run.agents or [])
        if not held or held < wanted:
            raise RanksFencedError(
                trial_id, attempt, "its slot claim is gone (the slots may be another trial's)"
            )
    return run_id


def claimed_slots(session: Session, trial_id: int, claim_token: str) -> int:
    """How many slots the ledger holds for ``trial_id`` under the claim ``claim_token``.

    Example:
        >>> from storage import session_scope
        >>> with session_scope(url) as session:
        ...     claimed_slots(session, trial_id=1, claim_token="no-such-claim")
        0
    """
    return int(
        session.scalar(
            select(func.count())
            .select_from(Allocation)
            .where(Allocation.trial_id == trial_id, Allocation.claim_token == claim_token)
        )
        or 0
    )
