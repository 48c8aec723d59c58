"""Warm jobs' shared rows: the processes going on as the next run's, the rule for an idle job.

Both hand-overs of a warm job use these: the driver's
(``trials.coordination.warm_jobs``) and rank 0's start of a trial decided ahead
(``trials.runtime``), which the layer rule keeps from importing each other.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from storage._models import (
    Experiment,
    ExperimentState,
    QueuedTrial,
    TrialProcess,
    TrialRun,
    WarmJob,
    utcnow,
)


def end_earlier_processes(session: Session, job: WarmJob, run: TrialRun) -> list[TrialProcess]:
    """End the open process rows of ``job``'s runs but ``run``: the same processes are
    ``run``'s from here on, one trial's at a time. The rows ended, for a caller that
    records some of them again under ``run`` (rank 0 starting a trial decided ahead).

    Both hand-overs use it: the driver's (``trials.coordination.warm_jobs.hand_over``)
    and rank 0's (``trials.runtime``'s start of the trial decided ahead).
    """
    earlier = select(TrialRun.id).where(
        TrialRun.launch_token == job.launch_token, TrialRun.id != run.id
    )
    rows = list(
        session.scalars(
            select(TrialProcess).where(
                TrialProcess.run_id.in_(earlier), TrialProcess.ended_at.is_(None)
            )
        )
    )
    now = utcnow()
    for row in rows:
        row.ended_at = now
    return rows


def _live_experiments(lease_s: float) -> Select[Any]:
    """The ids of the active experiments whose driver heartbeat within ``lease_s``.

    A placement decision drops the queue of every other experiment before it decides.
    """
    cutoff = utcnow() - _dt.timedelta(seconds=lease_s)
    return select(Experiment.id).where(
        Experiment.state == ExperimentState.ACTIVE, Experiment.driver_heartbeat_at >= cutoff
    )


def contesting_trial(
    session: Session, *, experiment_id: int, pool: str, slots: int, priority: int, lease_s: float
) -> int | None:
    """A waiting trial that keeps an idle warm job from its own search's next trial; None.

    The rule of the placement decision for an idle warm job (the pure form over a
    decision's rows is ``trials.coordination.warm_jobs.match_idle_jobs``), for one job
    of ``experiment_id`` with ``slots`` slots in ``pool`` and its search's next trial of
    that shape at ``priority``: the job gets that trial unless a trial of another shape
    (another search's, or this search's of another size) waits in the pool, not placed
    and its driver live, at the same or a higher priority (a number no larger). Then
    the job's slots go to the decision's order instead, and this is such a trial.

    Its driver decides a job's next trial ahead under this rule, and the job's rank 0
    checks it again when it starts that trial at the hand-back.
    """
    return session.scalar(
        select(QueuedTrial.trial_id)
        .where(
            QueuedTrial.experiment_id.in_(_live_experiments(lease_s)),
            QueuedTrial.resource_pool == pool,
            QueuedTrial.placement.is_(None),
            QueuedTrial.priority <= priority,
            or_(QueuedTrial.experiment_id != experiment_id, QueuedTrial.slots != slots),
        )
        .order_by(QueuedTrial.priority, QueuedTrial.trial_id)
        .limit(1)
    )
