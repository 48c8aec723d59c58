"""Warm jobs in the database: which exist, which trial each runs, who gets an idle one.

With ``resources.reuse_workers`` a trial's ``torchrun`` job outlives the trial: its
ranks hand the slots back (:mod:`trials.runtime._warm`) and wait for the next trial of
the same shape (same experiment, same slots on the same agents). This module is the
database side, shared by the driver that owns a job and by whichever driver makes a
placement decision (:mod:`trials.coordination.cluster_queue`):

- the job's slots stay in the slot ledger the whole time (``Allocation.warm_job_id``):
  under the trial running on it, and while it is idle under the last trial it ran, so
  no decision ever sees them free while the job's processes live;
- a decision hands an idle job the first waiting trial of its shape
  (:func:`match_idle_jobs`), moving the ledger rows to that trial, unless a trial of
  another shape waits at the same or a higher priority: then the job is asked to end
  and the normal decision places what waits, so reuse never blocks a waiting trial or
  starves a larger one;
- a job's rows leave the ledger only in :func:`close_job`, once its processes are gone.

Example:
    >>> from storage import TrialRun, WarmJob, session_scope
    >>> from trials.coordination.allocations import claim
    >>> from trials.scheduler import AgentSlots, Placement
    >>> placement = Placement(1, pool.name, (AgentSlots(pool.agents[0], (0, 1)),))
    >>> with session_scope(url) as session:
    ...     token = claim(session, placement, trial_id=1, experiment_id=1, lease_s=30.0)
    ...     run = TrialRun(trial_id=1, attempt=0, launch_token=token)
    ...     session.add(run)
    ...     session.flush()
    ...     job_id = open_job(session, run, placement, experiment_id=1)
    ...     request_end(session, job_id, "no trial of its shape waits")
    >>> with session_scope(url) as session:
    ...     session.get(WarmJob, job_id).end_reason
    'no trial of its shape waits'
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update

from storage import (
    Allocation,
    QueuedTrial,
    Trial,
    TrialRun,
    WarmJob,
    end_earlier_processes,
    utcnow,
)
from trials.config import EIGHTHS_PER_SLOT, slot_share_of
from trials.coordination.allocations import new_claim_token, unplace
from trials.labels import trial_label

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from trials.scheduler import Placement


def placement_record(placement: Placement) -> list[dict[str, Any]]:
    """A placement as the database stores it (one ``{agent, host, slots}`` per agent; a
    share of one slot adds ``eighths``, what it holds of that slot).

    Example:
        >>> from trials.scheduler import Agent, AgentSlots, Placement
        >>> quarter = Placement(1, "p", (AgentSlots(Agent("a", "h", (0,)), (0,)),), share=0.25)
        >>> placement_record(quarter)
        [{'agent': 'a', 'host': 'h', 'slots': [0], 'eighths': 2}]
        >>> share_of_record(placement_record(quarter))
        0.25
    """
    share = {"eighths": placement.eighths} if placement.share < 1.0 else {}
    return [
        {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots), **share}
        for part in placement.agents
    ]


def share_of_record(record: Sequence[dict[str, Any]] | None) -> float:
    """The share of its slots a stored placement holds (1.0: whole slots)."""
    eighths = min((int(part.get("eighths", EIGHTHS_PER_SLOT)) for part in record or ()), default=8)
    return slot_share_of(eighths)


def open_job(session: Session, run: TrialRun, placement: Placement, *, experiment_id: int) -> int:
    """Record a new warm job for ``run`` (its first trial, about to launch); its id.

    The trial's slots (claimed already) become the job's: they stay held after the
    trial until the job ends.
    """
    assert run.launch_token is not None
    job = WarmJob(
        experiment_id=experiment_id,
        resource_pool=placement.pool,
        slots=placement.slots,
        placement=placement_record(placement),
        launch_token=run.launch_token,
        current_trial_id=run.trial_id,
        current_run_id=run.id,
        trials_run=0,
    )
    session.add(job)
    session.flush()
    session.execute(
        update(Allocation).where(Allocation.trial_id == run.trial_id).values(warm_job_id=job.id)
    )
    return job.id


def hand_over(session: Session, job_id: int, run: TrialRun, spec: dict[str, Any]) -> None:
    """Give idle job ``job_id`` its reserved trial's run; rank 0 takes ``spec`` from here.

    The processes' rows under the job's earlier runs end now: from here on the same
    processes are the new run's (recorded under it), one trial's at a time.
    """
    job = session.get(WarmJob, job_id)
    assert job is not None
    end_earlier_processes(session, job, run)
    session.execute(
        update(WarmJob)
        .where(WarmJob.id == job_id)
        .values(
            current_trial_id=run.trial_id,
            current_run_id=run.id,
            reserved_trial_id=None,
            next_run_id=run.id,
            next_spec=spec,
            idle_since=None,
        )
    )


def reserved_job(session: Session, trial_id: int) -> WarmJob | None:
    """The live warm job a decision reserved for ``trial_id``, if any."""
    return session.scalars(
        select(WarmJob).where(WarmJob.reserved_trial_id == trial_id, WarmJob.ended_at.is_(None))
    ).first()


def request_end(session: Session, job_id: int, reason: str) -> None:
    """Ask the job to end: its ranks exit at their next look (idle) or after the trial."""
    session.execute(
        update(WarmJob)
        .where(WarmJob.id == job_id, WarmJob.end_requested_at.is_(None))
        .values(end_requested_at=utcnow(), end_reason=reason)
    )


def close_job(session: Session, job_id: int, reason: str | None = None) -> None:
    """The job's processes are confirmed gone: mark it ended and free its slots.

    A trial a decision reserved the job for waits again for a decision of its own; one
    its driver decided ahead (``ahead_trial_id``) was never out of its driver's hands.
    """
    reserved = session.scalar(select(WarmJob.reserved_trial_id).where(WarmJob.id == job_id))
    if reserved is not None:
        unplace(session, reserved)
    session.execute(
        update(WarmJob)
        .where(WarmJob.id == job_id, WarmJob.ended_at.is_(None))
        .values(
            ended_at=utcnow(),
            current_trial_id=None,
            current_run_id=None,
            reserved_trial_id=None,
            next_run_id=None,
            next_spec=None,
            ahead_trial_id=None,
            ahead=None,
        )
    )
    if reason:
        session.execute(
            update(WarmJob)
            .where(WarmJob.id == job_id, WarmJob.end_reason.is_(None))
            .values(end_reason=reason)
        )
    session.execute(delete(Allocation).where(Allocation.warm_job_id == job_id))


def live_jobs(session: Session, experiment_id: int) -> list[WarmJob]:
    """The experiment's warm jobs not yet confirmed ended, oldest first."""
    return list(
        session.scalars(
            select(WarmJob)
            .where(WarmJob.experiment_id == experiment_id, WarmJob.ended_at.is_(None))
            .order_by(WarmJob.id)
        )
    )


def latest_run(session: Session, job: WarmJob) -> TrialRun | None:
    """The newest run started on ``job`` (its processes carry that run's token)."""
    return session.scalars(
        select(TrialRun)
        .where(TrialRun.launch_token == job.launch_token)
        .order_by(TrialRun.id.desc())
    ).first()


@dataclass(frozen=True)
class WaitingTrial:
    """A queue row as :func:`match_idle_jobs` needs it."""

    trial_id: int
    experiment_id: int
    slots: int
    priority: int


@dataclass(frozen=True)
class IdleJob:
    """An idle warm job as :func:`match_idle_jobs` needs it."""

    job_id: int
    experiment_id: int
    slots: int
    idle_since: _dt.datetime | None


@dataclass(frozen=True)
class WarmMatch:
    """What a decision does with the idle warm jobs of a pool."""

    #: job id -> the trial it gets.
    reserved: dict[int, int]
    #: job id -> why it must end.
    ending: dict[int, str]


def match_idle_jobs(
    idle: Sequence[IdleJob],
    waiting: Sequence[WaitingTrial],
    *,
    label: Any = None,
) -> WarmMatch:
    """Pair idle jobs with waiting trials of their shape (pure; the decision applies it).

    ``waiting`` are the trials the decision could not place on free slots, each
    class's first at least. An idle job gets its experiment's first waiting trial of
    its size (by priority, then arrival) unless a trial of another shape waits at the
    same or a higher priority (a lower number): then the job ends, so its slots go to
    the decision's order (priority, fair share, FIFO) instead of to its own search.
    A job with no trial of its shape is left as it is: a decision can run between a
    trial's hand-back and its driver's next ask (its own driver's decision included,
    before that driver has seen the hand-back), and ending the job then would throw
    away the ranks the next trial is about to need. Its driver ends it once it has seen
    the hand-back and has no trial of its shape to give it
    (``RunningTrials.end_unneeded_warm_jobs``).

    The rule for one job and its search's next trial, as a query over the queue, is
    :func:`storage.contesting_trial`: a driver decides a running job's next trials
    ahead under it, and the job's rank 0 checks it again as it starts one.

    Example:
        >>> match_idle_jobs([IdleJob(1, 7, 2, None)], [WaitingTrial(30, 7, 2, 42)]).reserved
        {1: 30}
    """
    name = label or (lambda trial_id: str(trial_id))
    taken: set[int] = set()
    reserved: dict[int, int] = {}
    ending: dict[int, str] = {}
    ordered = sorted(waiting, key=lambda trial: (trial.priority, trial.trial_id))
    for job in sorted(idle, key=lambda job: (job.idle_since or _dt.datetime.min, job.job_id)):
        shape = (job.experiment_id, job.slots)
        mine = [
            trial
            for trial in ordered
            if (trial.experiment_id, trial.slots) == shape and trial.trial_id not in taken
        ]
        first = mine[0] if mine else None
        others = [
            trial
            for trial in ordered
            if (trial.experiment_id, trial.slots) != shape
            and (first is None or trial.priority <= first.priority)
        ]
        if others:
            wanted = others[0]
            ending[job.job_id] = (
                f"its slots are wanted by trial {name(wanted.trial_id)} "
                f"({wanted.slots} slot{'s' if wanted.slots != 1 else ''})"
            )
        elif first is not None:
            reserved[job.job_id] = first.trial_id
            taken.add(first.trial_id)
    return WarmMatch(reserved, ending)


def idle_jobs(session: Session, pool: str) -> list[IdleJob]:
    """The pool's idle warm jobs that nobody reserved or asked to end yet."""
    return [
        IdleJob(job_id, experiment_id, slots, idle_since)
        for job_id, experiment_id, slots, idle_since in session.execute(
            select(WarmJob.id, WarmJob.experiment_id, WarmJob.slots, WarmJob.idle_since).where(
                WarmJob.resource_pool == pool,
                WarmJob.ended_at.is_(None),
                WarmJob.end_requested_at.is_(None),
                WarmJob.current_trial_id.is_(None),
                WarmJob.reserved_trial_id.is_(None),
            )
        )
    ]


def reserve(session: Session, job_id: int, trial_id: int, now: _dt.datetime) -> None:
    """Hold idle job ``job_id`` for ``trial_id``: its slots move to the trial, and the
    trial's queue row is placed on the job's agents (its driver hands it over).

    The reservation is a claim like a decision's: a fresh token on the job's ledger rows
    and on the queue row, which the launch re-checks (a job closed meanwhile, its rows
    gone, starts nothing).
    """
    job = session.get(WarmJob, job_id)
    assert job is not None
    token = new_claim_token()
    session.execute(
        update(Allocation)
        .where(Allocation.warm_job_id == job_id)
        .values(trial_id=trial_id, claim_token=token)
    )
    job.reserved_trial_id = trial_id
    session.execute(
        update(QueuedTrial)
        .where(QueuedTrial.trial_id == trial_id)
        .values(placement=job.placement, claim_token=token, reason=None, decided_at=now)
    )


def trial_numbers(session: Session, trial_ids: Sequence[int]) -> dict[int, str]:
    """``experiment.number`` labels of ``trial_ids``."""
    if not trial_ids:
        return {}
    return {
        trial_id: trial_label(experiment_id, number)
        for trial_id, experiment_id, number in session.execute(
            select(Trial.id, Trial.experiment_id, Trial.optuna_trial_number).where(
                Trial.id.in_(list(trial_ids))
            )
        )
    }
