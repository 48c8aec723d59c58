"""The search driver's idle warm jobs: ranks kept running between two trials of one shape.

With ``resources.reuse_workers`` a trial that finished or was pruned hands its job back
and the job's processes wait for the next trial of its shape
(:mod:`trials.coordination.warm_jobs` keeps the rows). :class:`IdleWarmJobs` holds the
idle jobs of this driver: it closes those that exited or were asked to end, asks the
ones no waiting trial can use to end, gives one to the launch of the trial the
placement reserved it for, and waits (briefly) for its ranks to take that trial. The
running attempts (:class:`searcher.driver.running.RunningTrials`) hand jobs back to it and
take them from it.

The driver uses it so (its jobs run processes, so this is not run as an example; the
end-to-end tests run it)::

    warm = IdleWarmJobs(ctx)
    warm.add(IdleJob(job_id=1, job=job, slots=2, log_path=log_path))
    warm.end_unneeded(waiting_sizes={4})  # no trial of 2 slots waits: job 1 is asked to end
    warm.reap()  # closed once its ranks exited (or past kill_grace_s)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from searcher.driver.context import DriverContext
from storage import TrialRun, WarmJob, get_engine, session_scope
from trials.coordination import warm_jobs
from trials.coordination.attempts import end_run
from trials.executors import TrialJob, mark_processes_ended
from trials.launch.launcher import write_log_line

# How long, at most, the driver waits for the ranks of a job it handed a trial to take
# it (:meth:`IdleWarmJobs.await_taken`), and how often it looks meanwhile.
_HAND_OVER_WAIT_S = 0.1
_HAND_OVER_POLL_S = 0.003


@dataclass
class IdleJob:
    """A warm job of this driver's between two trials: its processes wait for the next."""

    job_id: int
    job: TrialJob
    slots: int
    log_path: Path
    # When this driver saw that the job was asked to end (its ranks exit on their own).
    ending_since: float | None = None


class IdleWarmJobs:
    """This driver's idle warm jobs, by job id."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        self._idle: dict[int, IdleJob] = {}
        # Runs handed to jobs taken since the last :meth:`await_taken`.
        self._handed_over: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._idle)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._idle

    def __iter__(self) -> Iterator[IdleJob]:
        return iter(list(self._idle.values()))

    def get(self, job_id: int) -> IdleJob | None:
        """The idle job ``job_id``, if this driver holds it."""
        return self._idle.get(job_id)

    def add(self, idle: IdleJob) -> None:
        """Hold ``idle`` (its trial handed it back) until a trial of its shape takes it."""
        self._idle[idle.job_id] = idle

    def take(self, job_id: int, *, handed_run_id: int) -> None:
        """Stop holding the job: the attempt whose run is ``handed_run_id`` runs on it now."""
        del self._idle[job_id]
        self._handed_over.append(handed_run_id)

    def await_taken(self) -> bool:
        """Wait, briefly, until the ranks of the jobs taken since the last call took their trials.

        Rank 0 starts a handed-over trial with one fenced write (``storage.start_ranks``).
        What the driver's tick does next (Optuna's tell, the ask ahead: the sampler's CPU
        and several transactions) would otherwise go first, on SQLite's one writer and a
        loaded machine's cores, while the job's slots sit idle. Returns once every such
        run's ranks started or the run ended, or after ``_HAND_OVER_WAIT_S``: False then.
        True, at once, when another of the experiment's warm jobs handed its trial back
        meanwhile: the driver's tick should end, so that the next one hands that job its
        next trial before anything else.
        """
        waiting, self._handed_over = self._handed_over, []
        deadline = time.monotonic() + _HAND_OVER_WAIT_S
        while waiting and time.monotonic() < deadline:
            time.sleep(_HAND_OVER_POLL_S)
            # Deferred: a look every 3 ms must not hold the write lock rank 0's take needs.
            with session_scope(get_engine(self.ctx.db_url, read_only=True)) as session:
                taken = set(
                    session.scalars(
                        select(TrialRun.id).where(
                            TrialRun.id.in_(waiting),
                            TrialRun.ranks_started_at.is_not(None)
                            | TrialRun.ended_at.is_not(None),
                        )
                    )
                )
                # Idle (its ranks cleared its run) but not yet seen idle by this driver.
                handed_back = session.scalar(
                    select(WarmJob.id)
                    .where(
                        WarmJob.experiment_id == self.ctx.experiment_id,
                        WarmJob.ended_at.is_(None),
                        WarmJob.current_run_id.is_(None),
                        WarmJob.id.not_in(list(self._idle)),
                    )
                    .limit(1)
                )
            if handed_back is not None:
                return True
            waiting = [run_id for run_id in waiting if run_id not in taken]
        return False

    def reap(self) -> None:
        """Close the idle warm jobs whose processes exited; end those past their grace."""
        if not self._idle:
            return
        with session_scope(self.ctx.db_url) as session:
            asked = dict(
                session.execute(
                    select(WarmJob.id, WarmJob.end_reason).where(
                        WarmJob.id.in_(list(self._idle)), WarmJob.end_requested_at.is_not(None)
                    )
                ).all()
            )
        now = time.monotonic()
        for job_id, idle in list(self._idle.items()):
            if job_id in asked and idle.ending_since is None:
                idle.ending_since = now
            exited = idle.job.poll() is not None
            overdue = (
                idle.ending_since is not None
                and now - idle.ending_since > self.ctx.timings.kill_grace_s
            )
            if exited or overdue:
                self.close(idle, asked.get(job_id))

    def close(self, idle: IdleJob, reason: str | None) -> None:
        """End an idle job's processes and, once they are gone, free its slots."""
        if not idle.job.end(grace_s=self.ctx.timings.kill_grace_s):
            return  # still there: the next tick tries again
        with session_scope(self.ctx.db_url) as session:
            job = session.get(WarmJob, idle.job_id)
            run = warm_jobs.latest_run(session, job) if job is not None else None
            if run is not None:
                # Confirms the processes gone in the database too (their rows end).
                end_run(session, run)
                if run.ended_at is not None:
                    mark_processes_ended(session, run)
            warm_jobs.close_job(session, idle.job_id, reason)
        write_log_line(
            idle.log_path, f"warm job {idle.job_id} ended: {reason or 'its ranks exited'}"
        )
        del self._idle[idle.job_id]

    def close_reclaimed(self, held_by_job: Mapping[int, int]) -> None:
        """Close the jobs holding fewer slots than they run on (``held_by_job``: the ledger's)."""
        for idle in self:
            if held_by_job.get(idle.job_id, 0) < idle.slots:
                self.close(idle, "its slots were reclaimed while its driver was stopped")

    def unneeded(self, waiting_sizes: set[int]) -> list[IdleJob]:
        """The idle jobs, not asked to end yet, whose size none of ``waiting_sizes`` is."""
        return [
            idle
            for idle in self._idle.values()
            if idle.ending_since is None and idle.slots not in waiting_sizes
        ]

    def end_unneeded(self, waiting_sizes: set[int]) -> None:
        """Ask the idle jobs that no waiting trial of this experiment can use to end.

        Runs after the tick's placement: a job still idle then was not handed a trial,
        and one whose size no trial of this search waits for would only hold slots.
        """
        unneeded = self.unneeded(waiting_sizes)
        if not unneeded:
            return
        with session_scope(self.ctx.db_url) as session:
            for idle in unneeded:
                warm_jobs.request_end(session, idle.job_id, "no trial of its shape waits")

    def end_all(self, reason: str) -> None:
        """Ask every idle warm job to end (the search pauses, ends or is killed)."""
        if not self._idle:
            return
        with session_scope(self.ctx.db_url) as session:
            for idle in self._idle.values():
                warm_jobs.request_end(session, idle.job_id, reason)
