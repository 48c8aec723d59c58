"""A warm job's next trials, decided ahead: rank 0 starts each at the hand-back, no driver between.

The driver asks each warm job's next trials while the current one runs (constant liar,
:meth:`searcher.driver.study_side.StudySide.fill_queue` with ``ahead``). :class:`AheadReservations`
also decides, while the job still runs, that these trials are the job's next ones, in
order and :data:`DEPTH` at most, each under the placement decision's rule for an idle
warm job (:func:`storage.contesting_trial`: its search's next trial of its shape,
unless a trial of another shape waits in the pool at the same or a higher priority),
and writes them on the job's row with each one's prepared start (runtime spec, log
path, claim token). They leave the pending queue meanwhile, so no placement decision
starts them anywhere else.

At the hand-back rank 0 starts the first of them in the transaction that ends the job's
trial, if its decision still stands (``trials.runtime._warm_ahead``), and the next moves
up; the driver sees the job running it at its next look, adopts it
(:meth:`searcher.driver.running.RunningTrials.reap`) and decides one more ahead. Two are kept
because a short trial may end before the driver has looked: rank 0 then starts the
second too, and the driver adopts both, in order. Otherwise rank 0 hands the job back
and clears them all, and the driver puts each back in the pending queue
(:meth:`AheadReservations.settle`, a :class:`~searcher.driver.decisions.Requeue`) for an
ordinary decision. A pause or a kill withdraws every reservation
(:meth:`AheadReservations.withdraw`); those rank 0 took first are adopted and then
stopped like any running trial. A reservation lives only on the job's row: a resume
closes every job left and runs its trials as any other queued ones.

Example:
    >>> from searcher.driver.placement import PendingQueue
    >>> ahead = AheadReservations(ctx)
    >>> pending = PendingQueue(ctx)
    >>> ahead.reserve([RunningJob(job_id=1, slots=1, trial_id=1)], pending)  # nothing waits
    >>> len(ahead)
    0
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from searcher.driver.context import DriverContext
from searcher.driver.decisions import Requeue
from searcher.driver.placement import PendingQueue
from searcher.driver.runtime_spec import build_runtime_spec
from storage import (
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    contesting_trial,
    session_scope,
)
from trials.coordination import cluster_queue
from trials.coordination.allocations import new_claim_token
from trials.labels import trial_log_name

#: How many trials the driver decides ahead for each warm job at work. With one, a trial
#: shorter than the driver's turn-around (it sees the hand-back, adopts the trial rank 0
#: started, tells Optuna, asks the next) finds none decided at its own end.
DEPTH = 2


@dataclass(frozen=True)
class RunningJob:
    """A warm job of this driver's running a trial: a reservation's candidate."""

    job_id: int
    slots: int
    #: The trial it runs now, as far as the driver knows: a reservation is written only
    #: while the job runs it or one of the trials decided ahead that rank 0 started.
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
    #: The run the job ran when the driver looked (None: idle, or ended): another than
    #: ``run_id`` when the trial had ended on the job already.
    job_run_id: int | None


class AheadReservations:
    """This driver's reservations: up to :data:`DEPTH` per warm job, in the order they run."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        # In order. The first ones may have started already (rank 0 took them and this
        # driver has not looked yet); the job's row holds the rest.
        self._by_job: dict[int, list[Reservation]] = {}

    def __len__(self) -> int:
        return sum(len(chain) for chain in self._by_job.values())

    def reserve(self, jobs: Sequence[RunningJob], pending: PendingQueue) -> None:
        """Decide ahead the next trials of each of ``jobs``, from ``pending``, up to :data:`DEPTH`.

        A trial reserved leaves ``pending``. A trial that ran before (it restarts from a
        checkpoint, its attempt is not the first) is left to an ordinary decision.
        """
        # Breadth first: every job's next trial before any job's second, so that a job
        # whose chain ran dry is served by the first trial asked.
        refused: set[int] = set()
        for depth in range(1, DEPTH + 1):
            for job in jobs:
                chain = self._by_job.get(job.job_id, [])
                if job.job_id in refused or len(chain) >= depth:
                    continue
                trial_id = pending.first_of_size(job.slots)
                if trial_id is None or not self._write(job, chain, trial_id):
                    refused.add(job.job_id)
                    continue
                pending.remove(trial_id)
                self._by_job[job.job_id] = [*chain, Reservation(job.job_id, trial_id, job.slots)]

    def _write(self, job: RunningJob, chain: Sequence[Reservation], trial_id: int) -> bool:
        """Decide ``trial_id`` ahead for ``job``, after ``chain``, on the job's row; whether it was.

        Written only while the job's row holds what is left of ``chain`` (rank 0 takes
        them from the front) and the job runs the trial that says so: ``job``'s, or the
        last one rank 0 took.
        """
        ctx = self.ctx
        priority = ctx.config.resources.priority
        with session_scope(ctx.db_url) as session:
            # Decided as a placement decision is, one at a time.
            cluster_queue.lock_queue(session)
            row = session.scalars(
                select(WarmJob).where(WarmJob.id == job.job_id).with_for_update()
            ).one_or_none()
            if row is None or row.ended_at is not None or row.end_requested_at is not None:
                return False
            known = [job.trial_id, *(reservation.trial_id for reservation in chain)]
            left = [start["trial_id"] for start in row.ahead or ()]
            taken = len(chain) - len(left)
            if taken < 0 or left != known[1 + taken :] or row.current_trial_id != known[taken]:
                return False
            trial = session.get(Trial, trial_id)
            if trial is None or trial.state != TrialState.QUEUED or trial.started_at is not None:
                return False
            if session.scalar(select(TrialRun.id).where(TrialRun.trial_id == trial_id).limit(1)):
                return False
            contested = contesting_trial(
                session,
                experiment_id=ctx.experiment_id,
                pool=ctx.pool.name,
                slots=job.slots,
                priority=priority,
                lease_s=ctx.timings.lease_s,
            )
            if contested is not None:
                return False
            log_path = Path(
                trial.log_path or ctx.run_dir / trial_log_name(trial.optuna_trial_number)
            )
            spec = build_runtime_spec(
                ctx, trial, 0, None, log_path=log_path, warm_job_id=job.job_id
            )
            start = {
                "trial_id": trial_id,
                "priority": priority,
                "claim_token": new_claim_token(),
                "log_path": str(log_path),
                "spec": json.loads(spec.model_dump_json(exclude={"db_url"})),
            }
            row.ahead = [*(row.ahead or ()), start]
            row.ahead_trial_id = row.ahead[0]["trial_id"]
            return True

    def share(self, sizes: Sequence[int]) -> list[Requeue]:
        """Withdraw, for each of ``sizes``, the last of :data:`DEPTH` trials decided ahead
        for a job of that size; those trials wait again.

        For idle jobs that no waiting trial fits: one runs such a trial now, rather than
        end while the trial waits its turn behind two others on a busy job (at the
        search's end). The busy job keeps its next trial decided. A trial rank 0 took
        first (it runs) is not withdrawn.
        """
        shared: list[Requeue] = []
        for slots in sizes:
            for job_id, chain in list(self._by_job.items()):
                if len(chain) == DEPTH and chain[-1].slots == slots and self._drop_last(chain):
                    self._by_job[job_id] = chain[:-1]
                    shared.append(Requeue(trial_id=chain[-1].trial_id, slots=slots))
                    break
        return shared

    def _drop_last(self, chain: Sequence[Reservation]) -> bool:
        """Take the last of ``chain`` off its job's row if it is still there; whether it was."""
        last = chain[-1]
        with session_scope(self.ctx.db_url) as session:
            row = session.scalars(
                select(WarmJob).where(WarmJob.id == last.job_id).with_for_update()
            ).one_or_none()
            starts = list(row.ahead or ()) if row is not None else []
            if row is None or not starts or starts[-1]["trial_id"] != last.trial_id:
                return False
            rest = starts[:-1]
            row.ahead = rest or None
            row.ahead_trial_id = rest[0]["trial_id"] if rest else None
            return True

    def settle(self, job_id: int) -> list[Requeue | Started]:
        """At the hand-back of ``job_id``'s trial: what became of its first reservation.

        ``[Started]`` when rank 0 started it in that hand-back (the driver adopts it;
        the next ones stay reserved), else a :class:`~searcher.driver.decisions.Requeue` for
        each reservation (rank 0 refused, or the job ended: every one waits again, and
        rank 0 can take none of them from here on). Empty when the job has none. One
        transaction: the withdrawal and the look at what rank 0 did cannot interleave
        with its start.
        """
        chain = self._by_job.pop(job_id, [])
        if not chain:
            return []
        first, rest = chain[0], chain[1:]
        with session_scope(self.ctx.db_url) as session:
            # Still first on the row: rank 0 did not take it, and now cannot.
            _clear(session, job_id, chain[:1])
            run_id = started_run(session, first)
            if run_id is None:
                _clear(session, job_id, chain)
            job_run_id = _job_run(session, job_id)
        if run_id is None:
            return [Requeue(trial_id=r.trial_id, slots=r.slots) for r in chain]
        if rest:
            self._by_job[job_id] = rest
        return [Started(first, run_id, job_run_id)]

    def withdraw(self, job_id: int) -> list[Requeue | Started]:
        """End every reservation on ``job_id`` (a pause, a kill, the job exited), in order.

        A :class:`Started` for each that rank 0 started first (the first ones: the driver
        adopts them in order, each ended the one before it on the job), a
        :class:`~searcher.driver.decisions.Requeue` for each other (it waits again). One
        transaction, as :meth:`settle`.
        """
        chain = self._by_job.pop(job_id, [])
        if not chain:
            return []
        with session_scope(self.ctx.db_url) as session:
            _clear(session, job_id, chain)
            runs = [started_run(session, reservation) for reservation in chain]
            job_run_id = _job_run(session, job_id)
        return [
            Requeue(trial_id=r.trial_id, slots=r.slots)
            if run_id is None
            else Started(r, run_id, job_run_id)
            for r, run_id in zip(chain, runs, strict=True)
        ]

    def withdraw_except(self, jobs: set[int]) -> list[Requeue]:
        """Withdraw the reservations of warm jobs not in ``jobs`` (they exited); what waits again.

        Only a job that handed its trial back can have started a trial decided ahead,
        and the driver settles those as it sees the hand-back.
        """
        withdrawn = [
            settled
            for job_id in list(self._by_job)
            if job_id not in jobs
            for settled in self.withdraw(job_id)
        ]
        return [requeue for requeue in withdrawn if isinstance(requeue, Requeue)]


def _clear(session: Session, job_id: int, chain: Sequence[Reservation]) -> None:
    """Take ``chain``'s trials off the job's row: rank 0 starts none of them from here on.

    The row holds what is left of the chain (rank 0 takes from its front), or nothing.
    """
    session.execute(
        update(WarmJob)
        .where(
            WarmJob.id == job_id,
            WarmJob.ahead_trial_id.in_([reservation.trial_id for reservation in chain]),
        )
        .values(ahead_trial_id=None, ahead=None)
    )


def _job_run(session: Session, job_id: int) -> int | None:
    """The run the warm job runs now (None: idle, or ended)."""
    return session.scalar(select(WarmJob.current_run_id).where(WarmJob.id == job_id))


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
