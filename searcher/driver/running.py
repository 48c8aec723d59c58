"""The search driver's running attempts: start them, watch them, end them, reap them.

Each attempt is started through the executor seam (:mod:`trials.executors`): its run
row is written first, in the transaction that confirms the slot claim behind its
placement (:func:`trials.coordination.allocations.confirm_claim`: a claim lost while this driver
was stopped starts nothing), and the launch token finds every process it starts,
should the driver die; then ``executor.launch`` starts it, then what finds it again
is recorded.
:class:`RunningTrials` holds the :class:`~trials.executors.TrialJob` of each attempt
this driver started, reaps those that exited (the outcome goes to
:class:`~searcher.driver.outcomes.Outcomes`, and what it decided back to the driver as
:mod:`searcher.driver.decisions`), ends those that hang, and preempts (pause) or
kills them all. :func:`end_leftovers` ends what a dead driver left running.

Two attempts of a trial never overlap, and an attempt's slots go back to the ledger
only once its processes are confirmed gone.

The driver's tick uses it so (``launch`` starts the attempts' processes, so this is
not run as an example; the end-to-end tests run it)::

    running = RunningTrials(ctx, outcomes)
    decisions = running.reap()
    decisions = running.launch(pending.place())
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from searcher.driver.context import DriverContext, driver_log
from searcher.driver.control import Control, Stop
from searcher.driver.decisions import Decision, Requeue
from searcher.driver.handoff import DEPTH, AheadReservations, RunningJob, Started
from searcher.driver.launching import (
    Attempt,
    AttemptStarter,
    release_claims,
    settle_failed_launch,
)
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import PendingQueue, Placed
from searcher.driver.warm import IdleJob, IdleWarmJobs
from searcher.experiments import UsageError
from storage import (
    FENCED_EXIT_CODE,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    get_engine,
    is_transient_error,
    session_scope,
    utcnow,
)
from trials.compute_spent import RunSpan, slot_seconds_spent
from trials.coordination import allocations as slot_ledger
from trials.coordination import warm_jobs
from trials.coordination.attempts import end_run, open_runs, request_stop
from trials.executors import JobEnding, TrialJob, mark_processes_ended
from trials.launch.launcher import write_log_line

_log = driver_log


# The run's reason when its ranks were fenced at their start (``storage.start_ranks``).
_FENCED_NOTE = "its ranks did not start: its slot claim was lost while its driver was stopped"

# How often, between ticks, the driver looks whether a warm job's trial handed it back:
# half the hand-back's expected wait. One look costs about 0.23 ms of CPU (SQLite), so
# 2% of a core while warm trials run.
_HAND_BACK_POLL_S = 0.01


@dataclass
class _Running:
    trial_id: int
    optuna_number: int
    attempt: int
    slots: int
    job: TrialJob
    started: float
    run_id: int
    # When this driver asked the attempt to stop (a pause).
    preempted_at: float | None = None
    # When this driver saw that another driver's placement decision asked the attempt
    # to stop (preemption by a higher-priority trial); the grace runs from then.
    preempted_by_cluster_at: float | None = None
    # Set when the driver ended the run for making no progress (hang_timeout_s), or for
    # outliving its trial's recorded end (exit_grace_s).
    hang_reason: str | None = None
    # Queued in the executor's cluster engine, no process started yet (and why).
    waiting: str | None = None
    # The warm job the attempt runs on (``resources.reuse_workers``).
    warm_job_id: int | None = None
    # Adopted from the job's rank 0 when the job had gone past it already (it ended).
    job_went_past: bool = False
    # The share of its slot it runs on: its slot-seconds count at it.
    share: float = 1.0

    @property
    def compute_slots(self) -> float:
        """What a second of it costs in slot-seconds: its slots at its share."""
        return self.slots * self.share


def _running(attempt: Attempt, job: TrialJob, waiting: str | None) -> _Running:
    """The started ``attempt`` as a running one, its processes ``job``."""
    return _Running(
        trial_id=attempt.trial_id,
        optuna_number=attempt.optuna_number,
        attempt=attempt.attempt,
        slots=attempt.slots,
        job=job,
        started=time.monotonic(),
        run_id=attempt.run_id,
        waiting=waiting,
        warm_job_id=attempt.warm_job_id,
        share=attempt.share,
    )


class RunningTrials:
    """The attempts this driver started and has not reaped yet, one per trial."""

    def __init__(self, ctx: DriverContext, outcomes: Outcomes) -> None:
        self.ctx = ctx
        self.outcomes = outcomes
        # What the recorded outcomes decided, kept until the driver takes it (a tick that
        # failed on the database leaves it for the next one).
        self._decided: list[Decision] = []
        self._running: dict[int, _Running] = {}
        self.warm = IdleWarmJobs(ctx)
        self.starter = AttemptStarter(ctx, self.warm)
        #: The next trials of each warm job at work, decided ahead (:mod:`searcher.driver.handoff`).
        self.ahead = AheadReservations(ctx)

    def __len__(self) -> int:
        return len(self._running)

    @property
    def wanted_ahead(self) -> int:
        """How many trials to ask ahead: :data:`~searcher.driver.handoff.DEPTH` per warm job at work."""
        return DEPTH * sum(1 for r in self._running.values() if r.warm_job_id is not None)

    @property
    def has_warm_jobs(self) -> bool:
        """Whether an idle warm job of this driver still has processes."""
        return bool(self.warm)

    def reserve_ahead(self, pending: PendingQueue) -> None:
        """Decide ahead, from ``pending``, the next trials of each warm job at work."""
        self.ahead.reserve(
            [_job_at_work(r) for r in self._running.values() if _at_work(r)], pending
        )

    # ----------------------------------------------------------------- starting
    def launch(self, placed: Sequence[Placed]) -> list[Decision]:
        """Start each placed trial's next attempt, in order; returns what the launches decided.

        A trial that started nothing (its claim was lost, or an earlier attempt still
        runs) goes back to the queue; one whose launch failed is failed, its slots
        released (:func:`~searcher.driver.launching.settle_failed_launch`). A transient database
        error stops the launches and propagates (the tick is retried): that trial and the
        later ones go back to the queue, the later ones without their claims, and what was
        decided waits in :meth:`take_decisions` for the next tick.
        """
        for position, each in enumerate(placed):
            try:
                self._launch_one(each)
            except BaseException:
                # The tick is retried: the trials placed after this one wait again,
                # without the slots claimed for them.
                later = placed[position + 1 :]
                self._decided += [Requeue(trial_id=p.trial_id, slots=p.slots) for p in later]
                release_claims(self.ctx, later)
                raise
        return self.take_decisions()

    def _launch_one(self, placed: Placed) -> None:
        """Start one placed trial's next attempt; settle a launch that raised (:meth:`launch`).

        Its placement is None for an executor whose cluster engine places trials
        (``executor.places_trials``): the attempt is submitted there and waits in that
        engine's queue until it starts.
        """
        trial_id = placed.trial_id
        try:
            on_warm = {r.run_id: r for r in self._running.values() if r.warm_job_id is not None}
            handed_back = self.starter.check_reserved_job(
                trial_id, {run_id: r.warm_job_id for run_id, r in on_warm.items()}
            )
            if handed_back is not None:
                self._hand_back_seen(on_warm[handed_back])
            attempt, job = self.starter.start(trial_id, placed.placement)
            running = _running(
                attempt, job, None if attempt.idle is not None else job.waiting_reason()
            )
            self._running[trial_id] = running
            if running.waiting:
                write_log_line(attempt.log_path, running.waiting)
        except Exception as exc:
            settled = settle_failed_launch(self.ctx, self.outcomes, placed, exc)
            if settled is None:
                # Nothing was started (the run's row comes first); the next tick
                # claims the slots again.
                self._decided.append(Requeue(trial_id=trial_id, slots=placed.slots))
                raise
            self._decided += settled

    def revalidate(self) -> None:
        """After this driver was stopped past its lease: end attempts whose slots were reclaimed.

        While it was stopped, another driver's decision may have reclaimed the claim of
        an attempt whose processes it saw gone and given the slots to another trial.
        Whatever of such an attempt still runs here must not share them: it is ended at
        once and reaped as any exit (the trial restarts from its latest checkpoint). An
        idle warm job whose slots were reclaimed is closed. Placements not launched yet
        need nothing: their launch confirms the claim's token.
        """
        if self.ctx.executor.places_trials:
            return  # the cluster engine keeps the ledger
        placed = [r for r in self._running.values() if r.waiting is None]
        jobs = [
            *(idle.job_id for idle in self.warm),
            *(r.warm_job_id for r in placed if r.warm_job_id is not None),
        ]
        with session_scope(self.ctx.db_url) as session:
            by_trial = slot_ledger.held_counts(
                session, trial_ids=[r.trial_id for r in placed if r.warm_job_id is None]
            )
            by_job = slot_ledger.held_counts(session, warm_job_ids=jobs)
        for running in placed:
            # A warm job's rows move to the next trial it is reserved for: the job's
            # processes hold the slots, whichever trial the rows name.
            held = (
                by_trial.get(running.trial_id, 0)
                if running.warm_job_id is None
                else by_job.get(running.warm_job_id, 0)
            )
            # Reclaimed once its processes were seen gone: normally it has exited, and
            # is reaped as usual. Anything of it still running must not share the slots.
            if held < running.slots and running.job.poll() is None:
                _log.warning(
                    "trial %s: its slots were reclaimed while this driver was stopped; "
                    "ending what is left of attempt %d",
                    self.ctx.label(running.optuna_number),
                    running.attempt,
                )
                running.job.end(grace_s=0.0)
        self.warm.close_reclaimed(by_job)

    # ----------------------------------------------------------------- reaping
    def take_decisions(self) -> list[Decision]:
        """What the outcomes recorded so far decided (requeue, stop), for the driver to apply."""
        decided, self._decided = self._decided, []
        return decided

    def reap(self) -> list[Decision]:
        """Record the outcome of every attempt that exited; end preempted ones past their grace.

        An attempt on a warm job that handed its slots back (its trial finished or was
        pruned, its processes run on) is recorded like an exit with code 0, and its job
        waits for the next trial of its shape; idle jobs that ended are closed. Returns
        what the outcomes decided (:meth:`take_decisions`).
        """
        handed_back = self.warm_handed_back()
        reaping = list(self._running.values())
        while reaping:
            running = reaping.pop(0)
            exit_code = running.job.poll()
            if running.run_id in handed_back:
                went_on = self._settle_hand_back(running)
                if went_on is not None:
                    if went_on.job_went_past:
                        # Rank 0 ran it to its end too before this look: reaped as such.
                        handed_back.add(went_on.run_id)
                        reaping.append(went_on)
                    continue
                if exit_code is None:
                    self._record_hand_back(running)
                    continue
            if exit_code is None:
                if running.waiting is not None:
                    _follow_queued(self.ctx, running)
                asked_at = running.preempted_at or running.preempted_by_cluster_at
                if (
                    asked_at is not None
                    and time.monotonic() - asked_at > self.ctx.timings.preempt_grace_s
                ):
                    running.job.end(grace_s=0.0)
                continue
            self._record_exit(running, exit_code)
            # Forgotten only once the outcome is committed: a tick that failed on the
            # database finds the exited run again and records it then.
            del self._running[running.trial_id]
        # Jobs handed back idle (rank 0 refused: the queue moved) or gone: their trials
        # decided ahead wait again.
        self._decided += self.ahead.withdraw_except(
            {r.warm_job_id for r in self._running.values() if r.warm_job_id}
        )
        self.warm.reap()
        return self.take_decisions()

    def wait(self, timeout_s: float) -> None:
        """Sleep until the next tick: ``timeout_s``, or less once a warm job is handed back.

        A warm job's ranks sit idle from their hand-back until this driver hands them the
        next trial, so the driver looks for hand-backs more often than it ticks: a cheap
        query every ``_HAND_BACK_POLL_S`` instead of up to a whole tick of idle slots.
        """
        deadline = time.monotonic() + timeout_s
        if not any(r.warm_job_id for r in self._running.values()):
            time.sleep(timeout_s)
            return
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(_HAND_BACK_POLL_S, left))
            try:
                if self.warm_handed_back():
                    return
            except Exception as exc:
                # The tick rides out a database outage; waiting here need not.
                if not is_transient_error(exc):
                    raise
                time.sleep(max(0.0, deadline - time.monotonic()))
                return

    # ----------------------------------------------------------------- warm jobs
    def warm_handed_back(self) -> set[int]:
        """Runs on warm jobs whose ranks handed the job back (idle, or on its next trial): a query."""
        runs = {r.warm_job_id: r.run_id for r in self._running.values() if r.warm_job_id}
        current = _current_warm_runs(self.ctx, list(runs))
        return {run_id for job_id, run_id in runs.items() if current.get(job_id) != run_id}

    def _hand_back_seen(self, running: _Running) -> None:
        """Record that ``running``'s warm job handed its trial back (idle, or on to the next).

        Each trial its rank 0 ran to its end meanwhile is adopted and recorded in turn.
        """
        went_on = self._settle_hand_back(running)
        while went_on is not None and went_on.job_went_past:
            running, went_on = went_on, self._settle_hand_back(went_on)
        if went_on is None:
            self._record_hand_back(running)

    def _settle_hand_back(self, running: _Running) -> _Running | None:
        """Settle the reservations of ``running``'s warm job, which handed its trial back.

        The attempt the job went on to (its rank 0 started the first trial decided ahead:
        it is adopted), or None (the job is idle or gone: every trial decided ahead waits
        again, and the caller records the hand-back or the exit).
        """
        assert running.warm_job_id is not None
        return self._went_on(running, self.ahead.settle(running.warm_job_id))

    def _withdraw_ahead(self, running: _Running) -> None:
        """Withdraw the reservations of ``running``'s warm job (a pause, a kill).

        Those its rank 0 started first are adopted (:meth:`_went_on`); when the job went
        past the last of them too, that hand-back is recorded now: the job is idle.
        """
        if running.warm_job_id is None:
            return
        went_on = self._went_on(running, self.ahead.withdraw(running.warm_job_id))
        if went_on is not None and went_on.job_went_past:
            self._record_hand_back(went_on)

    def _went_on(self, running: _Running, settled: Sequence[Requeue | Started]) -> _Running | None:
        """Apply what settling the reservations of ``running``'s warm job gave; the attempt
        the job went on to, or None.

        Rank 0 started each :class:`~searcher.driver.handoff.Started` trial in the transaction
        that ended the one before it on the job: each is adopted in order, and the
        trial before it recorded as handed back. Its ``job_went_past`` says whether the
        job had gone past the last one too when the driver looked (rank 0 ran it to its
        end meanwhile). A withdrawn reservation's trial waits again.
        """
        went_on: _Running | None = None
        for each in settled:
            if isinstance(each, Requeue):
                self._decided.append(each)
                continue
            trial_id, job_id = each.reservation.trial_id, each.reservation.job_id
            attempt, age_s = self.starter.adopt(trial_id, each.run_id, job_id)
            self._record_hand_back(running, went_on_s_ago=age_s)
            went_on = running = self._running[trial_id] = _running(attempt, running.job, None)
            running.started -= age_s
            running.job_went_past = each.job_run_id != each.run_id
        return went_on

    def _record_hand_back(self, running: _Running, *, went_on_s_ago: float | None = None) -> None:
        """The trial on a warm job ended (finished or pruned) and its ranks stay for the next.

        The attempt moves from the running ones to the idle jobs once its outcome is
        committed. ``went_on_s_ago``: the job went on, that many seconds ago, to the
        trial its rank 0 started at the hand-back (:meth:`_went_on`) instead.
        """
        assert running.warm_job_id is not None
        elapsed = time.monotonic() - running.started - (went_on_s_ago or 0.0)
        with session_scope(self.ctx.db_url) as session:
            trial = session.get(Trial, running.trial_id)
            run = session.get(TrialRun, running.run_id)
            assert trial is not None and run is not None
            trial.slot_seconds = (trial.slot_seconds or 0.0) + elapsed * running.compute_slots
            run.exit_code = trial.exit_code = 0
            # Its processes live on as the warm job's (their rows end at the next hand-over).
            run.ended_at = utcnow()
            run.reason = run.reason or "ended; its ranks wait warm for the next trial"
            log_path = Path(trial.log_path or self.ctx.run_dir / "warm.log")
            self._decided += self.outcomes.finalize(session, trial, exit_code=0)
        if went_on_s_ago is None:
            self.warm.add(IdleJob(running.warm_job_id, running.job, running.slots, log_path))
        del self._running[running.trial_id]

    def _record_exit(self, running: _Running, exit_code: int) -> None:
        elapsed = 0.0 if running.waiting else time.monotonic() - running.started
        ending = running.job.ending()
        with session_scope(self.ctx.db_url) as session:
            trial = session.get(Trial, running.trial_id)
            run = session.get(TrialRun, running.run_id)
            assert trial is not None and run is not None
            trial.slot_seconds = (trial.slot_seconds or 0.0) + elapsed * running.compute_slots
            run.exit_code = exit_code
            trial.exit_code = exit_code
            if running.hang_reason:
                run.reason = running.hang_reason
            # torchrun has exited; confirm that none of its ranks outlived it before
            # the slots go back to the ledger.
            if end_run(session, run, grace_s=0.0):
                slot_ledger.release(session, running.trial_id)
                if running.warm_job_id is not None:
                    warm_jobs.close_job(
                        session, running.warm_job_id, f"its trial's job exited ({exit_code})"
                    )
            if running.preempted_at is not None and not (trial.finished_at or trial.pruned_at):
                run.reason = "paused"
                trial.state = TrialState.QUEUED
                return
            stopped_by_cluster = _stopped_by_cluster(running, ending, run, exit_code)
            if stopped_by_cluster and not (trial.finished_at or trial.pruned_at):
                run.reason = f"{stopped_by_cluster}; resumes from its latest checkpoint"
                _log.info("trial %s: %s", self.ctx.label(running.optuna_number), run.reason)
                if trial.log_path:
                    write_log_line(Path(trial.log_path), run.reason)
            self._decided += self.outcomes.finalize(
                session,
                trial,
                exit_code=exit_code,
                cause=running.hang_reason or ending.cause,
                stopped_by_cluster=stopped_by_cluster,
            )

    # ----------------------------------------------------------------- ending
    def end_hung(self) -> None:
        """End runs whose rank 0 recorded no progress for ``hang_timeout_s``.

        A rank stuck in a collective, a dead NFS mount or a deadlocked data loader
        holds its slots forever otherwise; the run is ended and the trial restarted
        from its latest checkpoint like any other failure. Also notes the runs another
        driver's placement decision preempted (their grace starts now).
        """
        _end_hung(self.ctx, list(self._running.values()))

    def preempt(self) -> None:
        """Ask every running attempt to checkpoint and stop (a pause); each is asked once.

        The trials decided ahead for warm jobs wait again (for the resume); those a
        job's rank 0 started first are adopted, and the last one is asked too.
        """
        for running in list(self._running.values()):
            self._withdraw_ahead(running)
        self.warm.end_all("the search pauses")
        asking = [r for r in self._running.values() if r.preempted_at is None]
        if not asking:
            return
        with session_scope(self.ctx.db_url) as session:
            for running in asking:
                run = session.get(TrialRun, running.run_id)
                assert run is not None
                request_stop(session, run)
        now = time.monotonic()
        for running in asking:
            running.preempted_at = now

    def kill(self, control: Control) -> None:
        """End every running trial's processes; requeue them, or fail them on kill.

        On ``control.action`` KILL the trials fail ("killed by user"), on ERROR they
        fail with the experiment's stop reason, else they wait QUEUED for a resume.
        Optuna's tells are queued in :attr:`outcomes`: flush them after this returns.
        """
        kill_grace_s = self.ctx.timings.kill_grace_s
        # The trials decided ahead that a job's rank 0 started are adopted (the last one is
        # ended as a running one); the others stay QUEUED (the search's end says they
        # never ran).
        for running in list(self._running.values()):
            self._withdraw_ahead(running)
        for idle in self.warm:
            self.warm.close(idle, "the search stopped")
        for running in self._running.values():
            running.job.end(grace_s=kill_grace_s)
        with session_scope(self.ctx.db_url) as session:
            for running in self._running.values():
                run = session.get(TrialRun, running.run_id)
                trial = session.get(Trial, running.trial_id)
                assert run is not None and trial is not None
                run.reason = run.reason or "killed"
                if end_run(session, run):
                    slot_ledger.release(session, running.trial_id)
                    if running.warm_job_id is not None:
                        warm_jobs.close_job(session, running.warm_job_id, "the search stopped")
                if control.action == Stop.KILL:
                    trial.error = "killed by user"
                    self.outcomes.fail(trial)
                elif control.action == Stop.ERROR:
                    trial.error = f"experiment stopped: {control.stop_reason}"
                    self.outcomes.fail(trial)
                else:
                    trial.state = TrialState.QUEUED
        self._running.clear()


def _end_hung(ctx: DriverContext, attempts: Sequence[_Running]) -> None:
    """End ``attempts`` that hang; note those another driver's decision preempted.

    An attempt hangs when rank 0 records nothing for ``hang_timeout_s`` (or nothing at
    all past the start-up allowance), or when its processes are still there
    ``exit_grace_s`` after rank 0 recorded the trial's end: everything the trial had to
    record is in, and a process that never exits (a hung destructor or exit handler)
    would hold the slots until the hang timeout.
    """
    timeout_s = ctx.config.hang_timeout_s
    if not attempts:
        return
    # Until rank 0 first records anything (it does once the process group has
    # formed), start-up is measured: imports, rendezvous and DDP set-up take
    # seconds, minutes on a loaded machine, and are no hang.
    startup_s = max(timeout_s or 0.0, ctx.timings.startup_allowance_s)
    # An attempt still queued in its cluster engine has no process to hang.
    by_run = {r.run_id: r for r in attempts if r.waiting is None}
    if not by_run:
        return
    with session_scope(ctx.db_url) as session:
        rows = session.execute(
            select(
                TrialRun.id,
                TrialRun.started_at,
                TrialRun.progress_at,
                TrialRun.stop_reason,
                func.coalesce(Trial.finished_at, Trial.pruned_at),
            )
            .join(Trial, Trial.id == TrialRun.trial_id)
            .where(TrialRun.id.in_(list(by_run)))
        ).all()
    now = utcnow()
    for run_id, started_at, progress_at, stop_reason, trial_ended_at in rows:
        running = by_run[run_id]
        if stop_reason and running.preempted_by_cluster_at is None:
            running.preempted_by_cluster_at = time.monotonic()
            _log.info("trial %s: %s", ctx.label(running.optuna_number), stop_reason)
        reason = _hang_reason(
            now - started_at,
            None if progress_at is None else now - max(started_at, progress_at),
            # A warm job's trial hands the job back with its end: the job goes on.
            None
            if trial_ended_at is None or running.warm_job_id is not None
            else now - trial_ended_at,
            timeout_s=timeout_s,
            startup_s=startup_s,
            exit_grace_s=ctx.timings.exit_grace_s,
        )
        if running.hang_reason is None and reason is not None:
            running.hang_reason = reason
            _log.warning("trial %s: %s", ctx.label(running.optuna_number), reason)
            running.job.end(grace_s=0.0)


def _hang_reason(
    since_start: dt.timedelta,
    since_progress: dt.timedelta | None,
    since_end: dt.timedelta | None,
    *,
    timeout_s: float | None,
    startup_s: float,
    exit_grace_s: float,
) -> str | None:
    """Why an attempt counts as hung (the run's reason once ended), or None.

    ``since_progress`` is None before rank 0's first record, ``since_end`` before it
    records the trial's end. Past the end only ``exit_grace_s`` counts.

    Example:
        >>> from datetime import timedelta as s
        >>> _hang_reason(s(seconds=90), s(seconds=5), s(seconds=70), timeout_s=600,
        ...              startup_s=120, exit_grace_s=60)
        'its processes had not exited 70 s after the trial ended (exit_grace_s 60); ended'
        >>> _hang_reason(s(seconds=900), s(seconds=601), None, timeout_s=600,
        ...              startup_s=120, exit_grace_s=60)
        'no progress for 601 s (hang_timeout_s 600); ended'
        >>> _hang_reason(s(seconds=60), None, None, timeout_s=600, startup_s=120,
        ...              exit_grace_s=60) is None
        True
    """
    if since_end is not None:
        lingering_s = since_end.total_seconds()
        if lingering_s <= exit_grace_s:
            return None
        return (
            f"its processes had not exited {lingering_s:.0f} s after the trial ended "
            f"(exit_grace_s {exit_grace_s:g}); ended"
        )
    if timeout_s is None:
        return None
    if since_progress is None:
        idle_s = since_start.total_seconds()
        hung = idle_s > startup_s
        what = f"did not start within {idle_s:.0f} s"
    else:
        idle_s = since_progress.total_seconds()
        hung = idle_s > timeout_s
        what = f"no progress for {idle_s:.0f} s"
    return f"{what} (hang_timeout_s {timeout_s:g}); ended" if hung else None


def _follow_queued(ctx: DriverContext, running: _Running) -> None:
    """Note when an attempt queued in the cluster engine starts (or why it still waits).

    Its clock (slot-seconds, start-up and hang timeouts) starts then, not at submission.
    """
    reason = running.job.waiting_reason()
    if reason == running.waiting:
        return
    running.waiting = reason
    with session_scope(ctx.db_url) as session:
        run = session.get(TrialRun, running.run_id)
        trial = session.get(Trial, running.trial_id)
        assert run is not None and trial is not None
        if reason is None:
            running.started = time.monotonic()
            run.started_at = utcnow()
            run.agents = running.job.describe()
            nodes = ", ".join(node["agent"] for node in run.agents) or "its nodes"
            message = f"attempt {running.attempt} started on {nodes}"
        else:
            message = reason
        log_path = trial.log_path
    if log_path:
        write_log_line(Path(log_path), message)


def _stopped_by_cluster(
    running: _Running, ending: JobEnding, run: TrialRun, exit_code: int
) -> str | None:
    """Why the cluster, not a failure, stopped the exited ``running`` (it resumes); None."""
    stopped_by_cluster = ending.stopped_by_cluster
    if exit_code == FENCED_EXIT_CODE and running.hang_reason is None:
        # Its ranks found the run ended or its slot claim gone (this driver was
        # stopped meanwhile) and exited before touching a device: no failure.
        stopped_by_cluster = _FENCED_NOTE
    if stopped_by_cluster is None and run.stop_reason and running.hang_reason is None:
        # Preempted for a higher-priority trial by the cluster's placement
        # decision: it checkpointed and goes back to the queue, no restart.
        stopped_by_cluster = run.stop_reason
    if (
        stopped_by_cluster is None
        and ending.cause is None
        and run.stop_requested_at is not None
        and running.hang_reason is None
    ):
        # Not this driver's request (that is preempted_at), nor a cancelled job:
        # the ranks recorded a SIGTERM from the cluster (``--signal=TERM@120``
        # ahead of the time limit, say) and checkpointed.
        stopped_by_cluster = "stopped by a SIGTERM from the cluster"
    return stopped_by_cluster


def _at_work(running: _Running) -> bool:
    """Whether ``running`` runs on a warm job that may be given its next trial ahead.

    Not one queued in its cluster engine, asked to stop, or ended for a hang.
    """
    return (
        running.warm_job_id is not None
        and running.waiting is None
        and running.preempted_at is None
        and running.preempted_by_cluster_at is None
        and running.hang_reason is None
    )


def _job_at_work(running: _Running) -> RunningJob:
    assert running.warm_job_id is not None
    return RunningJob(running.warm_job_id, running.slots, running.trial_id)


def _current_warm_runs(ctx: DriverContext, jobs: list[int]) -> dict[int, int | None]:
    """The run each of the warm jobs ``jobs`` runs now, by job id.

    Asked every 10 ms while warm jobs run: a deferred (read-only) transaction, so the
    look never holds SQLite's write lock that a rank 0 handing back waits for.
    """
    if not jobs:
        return {}
    with session_scope(get_engine(ctx.db_url, read_only=True)) as session:
        return dict(
            session.execute(
                select(WarmJob.id, WarmJob.current_run_id).where(WarmJob.id.in_(jobs))
            ).all()
        )


def end_leftover_warm_jobs(ctx: DriverContext, session: Session) -> None:
    """End the warm jobs a dead driver left (idle or running a trial), then free their slots.

    Their processes are found like any leftover attempt's: by the newest run's recorded
    processes and launch token. A job whose processes cannot be ended from here keeps
    its slots, and resuming says so.
    """
    for job in warm_jobs.live_jobs(session, ctx.experiment_id):
        run = warm_jobs.latest_run(session, job)
        if run is not None:
            from trials.executors import executor_named

            executor = executor_named(run.executor)
            if not executor.end_leftovers(session, run, grace_s=ctx.timings.kill_grace_s):
                hosts = sorted({node.get("host", "?") for node in run.agents or []})
                raise UsageError(
                    f"warm job {job.id} still has processes on {', '.join(hosts)} that this "
                    "machine cannot end; end them, then resume"
                )
            mark_processes_ended(session, run)
        warm_jobs.close_job(session, job.id, "driver stopped; its trial continues cold")


def end_leftovers(ctx: DriverContext, session: Session, trial: Trial) -> None:
    """End every process a dead driver left running for ``trial``, then free its slots.

    The leftover attempt is over before anything else happens to the trial: its
    next attempt never overlaps it, and its slots are released only once it is gone.
    Releasing clears a queue placement made with the claim too (a decision had placed
    the trial, and its driver died before taking it): no decision hands it out again.
    Raises :class:`~searcher.experiments.UsageError` when processes on other hosts
    cannot be ended from here.
    """
    # A trial whose ranks reported its end before the driver died does not go on.
    ended_at = trial.finished_at or trial.pruned_at
    ended = ended_at is not None
    for run in open_runs(session, trial.id):
        # No driver timed this attempt: its compute is read from its row, from its
        # ranks' start to its last record (its trial's end, when that came first), as
        # a dead run's compute is counted for pruning (trials.compute_spent).
        untimed = RunSpan(
            run.ranks_started_at, last_progress_at=run.progress_at, ended_at=ended_at
        )
        compute_slots = trial.slots_per_trial * ctx.config.resources.slot_share
        untimed_slot_s = slot_seconds_spent([untimed], compute_slots, utcnow())
        gone = end_run(
            session,
            run,
            reason=(
                "driver stopped after the trial had ended"
                if ended
                else "driver stopped; trial continues from its latest checkpoint"
            ),
            grace_s=ctx.timings.kill_grace_s,
        )
        if not gone:
            hosts = sorted({node.get("host", "?") for node in run.agents or []})
            raise UsageError(
                f"trial {ctx.label(trial.optuna_trial_number)}: attempt {run.attempt} "
                "still has processes on "
                f"{', '.join(hosts)} that this machine cannot end; end them, then resume"
            )
        trial.slot_seconds = (trial.slot_seconds or 0.0) + untimed_slot_s
    slot_ledger.release(session, trial.id)
