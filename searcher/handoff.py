"""A warm job's next trial, decided ahead: rank 0 starts it at the hand-back, no driver between.

The driver asks each warm job's next trial while the current one runs (constant liar,
:meth:`searcher.study_side.StudySide.fill_queue` with ``ahead``). :class:`AheadReservations`
also decides, while the job still runs, that this trial is the job's next one, under
the placement decision's rule for an idle warm job
(:func:`trials.coordination.warm_jobs.match_idle_jobs`: its search's next trial of its
shape, unless a trial of another shape waits in the pool at the same or a higher
priority), and writes that decision on the job's row with the trial's prepared start
(runtime spec, log path, claim token). The trial leaves the pending queue meanwhile, so
no placement decision starts it anywhere else.

At the hand-back rank 0 starts the trial in the transaction that ends the job's trial,
if the decision still stands (``trials.runtime._warm_ahead``); the driver sees the job
running it at its next look and adopts it (:meth:`searcher.running.RunningTrials.reap`).
Otherwise rank 0 hands the job back and clears the reservation, and the driver puts the
trial back in the pending queue (:meth:`AheadReservations.cancel`, a
:class:`~searcher.decisions.Requeue`) for an ordinary decision. A pause or a kill
cancels every reservation; one rank 0 took first is adopted and then stopped like any
running trial. A reservation lives only on the job's row: a resume closes every job
left and runs the trial as any other queued one.

Example:
    >>> from searcher.placement import PendingQueue
    >>> ahead = AheadReservations(ctx)
    >>> pending = PendingQueue(ctx)
    >>> ahead.reserve([RunningJob(job_id=1, slots=1, trial_id=1)], pending)  # nothing waits
    >>> len(ahead)
    0
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Select, or_, select, update
from sqlalchemy.orm import Session

from searcher.decisions import Requeue
from searcher.driver_context import DriverContext
from searcher.placement import PendingQueue
from searcher.runtime_spec import build_runtime_spec
from storage import (
    Experiment,
    ExperimentState,
    QueuedTrial,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    session_scope,
    utcnow,
)
from trials.coordination import cluster_queue, warm_jobs
from trials.coordination.allocations import new_claim_token
from trials.labels import trial_log_name


@dataclass(frozen=True)
class RunningJob:
    """A warm job of this driver's running a trial: a reservation's candidate."""

    job_id: int
    slots: int
    #: The trial it runs now: the reservation is written only while it still does.
    trial_id: int


@dataclass(frozen=True)
class Reservation:
    """A trial decided ahead to run next on a warm job."""

    job_id: int
    trial_id: int
    slots: int


@dataclass(frozen=True)
class Started:
    """A reservation whose trial the job's rank 0 started, as run ``run_id``."""

    reservation: Reservation
    run_id: int


class AheadReservations:
    """This driver's reservations, one per warm job at most."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        self._by_job: dict[int, Reservation] = {}

    def __len__(self) -> int:
        return len(self._by_job)

    def reserve(self, jobs: Sequence[RunningJob], pending: PendingQueue) -> None:
        """Decide ahead the next trial of each of ``jobs`` that has none, from ``pending``.

        A trial reserved leaves ``pending``. A trial that ran before (it restarts from a
        checkpoint, its attempt is not the first) is left to an ordinary decision.
        """
        for job in jobs:
            if job.job_id in self._by_job:
                continue
            trial_id = pending.first_of_size(job.slots)
            if trial_id is None or not self._write(job, trial_id):
                continue
            pending.remove(trial_id)
            self._by_job[job.job_id] = Reservation(job.job_id, trial_id, job.slots)

    def _write(self, job: RunningJob, trial_id: int) -> bool:
        """Decide ``trial_id`` ahead for ``job`` and write it on the job's row; whether it was."""
        ctx = self.ctx
        priority = ctx.config.resources.priority
        with session_scope(ctx.db_url) as session:
            # Decided as a placement decision is, one at a time.
            cluster_queue.lock_queue(session)
            trial = session.get(Trial, trial_id)
            if trial is None or trial.state != TrialState.QUEUED or trial.started_at is not None:
                return False
            if session.scalar(select(TrialRun.id).where(TrialRun.trial_id == trial_id).limit(1)):
                return False
            first_other = session.execute(
                select(
                    QueuedTrial.trial_id,
                    QueuedTrial.experiment_id,
                    QueuedTrial.slots,
                    QueuedTrial.priority,
                )
                .where(
                    QueuedTrial.experiment_id.in_(_live_experiments(ctx)),
                    QueuedTrial.resource_pool == ctx.pool.name,
                    QueuedTrial.placement.is_(None),
                    or_(
                        QueuedTrial.experiment_id != ctx.experiment_id,
                        QueuedTrial.slots != job.slots,
                    ),
                )
                .order_by(QueuedTrial.priority, QueuedTrial.trial_id)
                .limit(1)
            ).first()
            waiting = [warm_jobs.WaitingTrial(trial_id, ctx.experiment_id, job.slots, priority)]
            if first_other is not None:
                waiting.append(warm_jobs.WaitingTrial(*first_other))
            match = warm_jobs.match_idle_jobs(
                [warm_jobs.IdleJob(job.job_id, ctx.experiment_id, job.slots, None)], waiting
            )
            if match.reserved.get(job.job_id) != trial_id:
                return False
            log_path = Path(
                trial.log_path or ctx.run_dir / trial_log_name(trial.optuna_trial_number)
            )
            spec = build_runtime_spec(
                ctx, trial, 0, None, log_path=log_path, warm_job_id=job.job_id
            )
            ahead = {
                "priority": priority,
                "claim_token": new_claim_token(),
                "log_path": str(log_path),
                "spec": json.loads(spec.model_dump_json(exclude={"db_url"})),
            }
            written = session.execute(
                update(WarmJob)
                .where(
                    WarmJob.id == job.job_id,
                    WarmJob.current_trial_id == job.trial_id,
                    WarmJob.ended_at.is_(None),
                    WarmJob.end_requested_at.is_(None),
                    WarmJob.ahead_trial_id.is_(None),
                )
                .values(ahead_trial_id=trial_id, ahead=ahead)
            )
            return bool(getattr(written, "rowcount", 0) == 1)

    def settle(self, job_id: int) -> Requeue | Started | None:
        """End the reservation on ``job_id``: withdrawn, or taken by the job's rank 0.

        A :class:`~searcher.decisions.Requeue` when it is withdrawn (its trial waits
        again; rank 0 can no longer take it), :class:`Started` when rank 0 started the
        trial first (the driver adopts it), None when the job has no reservation. One
        transaction: the withdrawal and the look at what rank 0 did cannot interleave
        with its start.
        """
        reservation = self._by_job.pop(job_id, None)
        if reservation is None:
            return None
        with session_scope(self.ctx.db_url) as session:
            session.execute(
                update(WarmJob)
                .where(WarmJob.id == job_id, WarmJob.ahead_trial_id == reservation.trial_id)
                .values(ahead_trial_id=None, ahead=None)
            )
            run_id = started_run(session, reservation)
        if run_id is not None:
            return Started(reservation, run_id)
        return Requeue(trial_id=reservation.trial_id, slots=reservation.slots)

    def withdraw_except(self, jobs: set[int]) -> list[Requeue]:
        """Withdraw the reservations of warm jobs not in ``jobs`` (they exited); what waits again.

        Only a job that handed its trial back can have started the trial decided
        ahead, and the driver settles those as it sees the hand-back.
        """
        settled = [self.settle(job_id) for job_id in list(self._by_job) if job_id not in jobs]
        return [requeue for requeue in settled if isinstance(requeue, Requeue)]


def _live_experiments(ctx: DriverContext) -> Select[Any]:
    """The experiments whose driver heartbeats: a decision drops the others' queue first."""
    cutoff = utcnow() - dt.timedelta(seconds=ctx.timings.lease_s)
    return select(Experiment.id).where(
        Experiment.state == ExperimentState.ACTIVE, Experiment.driver_heartbeat_at >= cutoff
    )


def started_run(session: Session, reservation: Reservation) -> int | None:
    """The run of the reserved trial on its job (rank 0 started it), if there is one.

    Read from the trial's runs rather than the job's current trial: the trial may
    have ended on the job already, before its driver looked.
    """
    token = select(WarmJob.launch_token).where(WarmJob.id == reservation.job_id)
    return session.scalar(
        select(TrialRun.id).where(
            TrialRun.trial_id == reservation.trial_id,
            TrialRun.launch_token == token.scalar_subquery(),
        )
    )
