"""The search driver's running attempts: start them, watch them, end them, reap them.

Each attempt is started through the executor seam (:mod:`trials.executors`): its run
row is written first, in the transaction that confirms the slot claim behind its
placement (:func:`trials.coordination.allocations.confirm_claim`: a claim lost while this driver
was stopped starts nothing), and the launch token finds every process it starts,
should the driver die; then ``executor.launch`` starts it, then what finds it again
is recorded.
:class:`RunningTrials` holds the :class:`~trials.executors.TrialJob` of each attempt
this driver started, reaps those that exited (the outcome goes to
:class:`~searcher.outcomes.Outcomes`, and what it decided back to the driver as
:mod:`searcher.decisions`), ends those that hang, and preempts (pause) or
kills them all. :func:`end_leftovers` ends what a dead driver left running.

Two attempts of a trial never overlap, and an attempt's slots go back to the ledger
only once its processes are confirmed gone.

The driver's tick uses it so (``launch`` starts the attempt's processes, so this is
not run as an example; the end-to-end tests run it)::

    running = RunningTrials(ctx, outcomes)
    running.launch(trial_id, placement)
    decisions = running.reap()
"""

from __future__ import annotations

import json
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.control import Control, Stop
from searcher.decisions import Decision
from searcher.driver_context import DriverContext, driver_log
from searcher.experiments import UsageError
from searcher.outcomes import Outcomes
from searcher.runtime_spec import build_runtime_spec
from searcher.study_side import missing_hparams
from storage import (
    FENCED_EXIT_CODE,
    Checkpoint,
    CheckpointState,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    is_transient_error,
    retry_transient,
    session_scope,
    utcnow,
)
from trials import per_slot_batch_size
from trials.coordination import allocations as slot_ledger
from trials.coordination import warm_jobs
from trials.coordination.allocations import ClaimedPlacement, ClaimLostError
from trials.coordination.attempts import end_run, open_runs, request_stop
from trials.executors import LaunchRequest, TrialJob, mark_processes_ended
from trials.labels import trial_log_name
from trials.launch.launcher import DB_URL_ENV_VAR, write_log_line

_log = driver_log


# The run's reason when its ranks were fenced at their start (``storage.start_ranks``).
_FENCED_NOTE = "its ranks did not start: its slot claim was lost while its driver was stopped"

# How often, between ticks, the driver looks whether a warm job's trial handed it back.
_HAND_BACK_POLL_S = 0.025


class EarlierAttemptRunning(RuntimeError):
    """The trial's previous attempt is not confirmed gone yet (a node that does not
    answer, a step Slurm has not cleaned up): the next attempt waits for it."""


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
    # Set when the driver ended the run for making no progress (hang_timeout_s).
    hang_reason: str | None = None
    # Queued in the executor's cluster engine, no process started yet (and why).
    waiting: str | None = None
    # The warm job the attempt runs on (``resources.reuse_workers``).
    warm_job_id: int | None = None


@dataclass
class _IdleJob:
    """A warm job of this driver's between two trials: its processes wait for the next."""

    job_id: int
    job: TrialJob
    slots: int
    log_path: Path
    # When this driver saw that the job was asked to end (its ranks exit on their own).
    ending_since: float | None = None


class RunningTrials:
    """The attempts this driver started and has not reaped yet, one per trial."""

    def __init__(self, ctx: DriverContext, outcomes: Outcomes) -> None:
        self.ctx = ctx
        self.outcomes = outcomes
        # What the recorded outcomes decided, kept until the driver takes it (a tick that
        # failed on the database leaves it for the next one).
        self._decided: list[Decision] = []
        self._running: dict[int, _Running] = {}
        self._idle: dict[int, _IdleJob] = {}

    def __len__(self) -> int:
        return len(self._running)

    @property
    def has_warm_jobs(self) -> bool:
        """Whether an idle warm job of this driver still has processes."""
        return bool(self._idle)

    # ----------------------------------------------------------------- starting
    def launch(self, trial_id: int, placement: ClaimedPlacement | None) -> None:
        """Start the trial's next attempt on ``placement`` (its slots are claimed).

        ``placement`` is None for an executor whose cluster engine places trials
        (``executor.places_trials``): the attempt is submitted there and waits in
        that engine's queue until it starts. Raises
        :class:`~trials.coordination.allocations.ClaimLostError`, having recorded and started
        nothing, when the claim behind ``placement`` no longer holds.
        """
        ctx = self.ctx
        self._check_reserved_job(trial_id)
        with session_scope(ctx.db_url) as session:
            if placement is not None:
                # First, in the transaction that records the run: every executor's
                # launch is fenced by the claim's token, warm reservations included.
                slot_ledger.confirm_claim(session, trial_id, placement, ctx.timings.lease_s)
            trial = session.get(Trial, trial_id)
            assert trial is not None
            missing = missing_hparams(ctx.config, trial.hparams)
            if missing:
                raise RuntimeError(
                    f"the trial has no value for hyperparameter(s) {', '.join(missing)}"
                )
            warm = warm_jobs.reserved_job(session, trial_id)
            idle = self._idle.get(warm.id) if warm is not None else None
            # Two attempts never overlap: whatever is left of an earlier one ends first.
            for earlier in open_runs(session, trial_id):
                if not end_run(session, earlier, reason="ended", grace_s=ctx.timings.kill_grace_s):
                    raise EarlierAttemptRunning(
                        f"trial {ctx.label(trial.optuna_trial_number)} waits: attempt "
                        f"{earlier.attempt} still has processes that could not be ended yet"
                    )
            attempt = len(trial.runs)
            checkpoint = _latest_checkpoint(session, trial_id)
            log_path = Path(
                trial.log_path or ctx.run_dir / trial_log_name(trial.optuna_trial_number)
            )
            # Written before any process starts: a driver that dies from here on leaves
            # a run whose launch token finds every process it started.
            run = TrialRun(
                trial_id=trial_id,
                attempt=attempt,
                executor=ctx.executor.name,
                agents=[
                    {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
                    for part in (placement.agents if placement is not None else ())
                ],
                # A warm job's processes carry its first run's token; so do its runs.
                launch_token=warm.launch_token if warm is not None else uuid.uuid4().hex,
                restored_from_checkpoint=checkpoint.uuid if checkpoint else None,
                restored_from_step=checkpoint.step if checkpoint else None,
                reason=None if attempt == 0 else "continued",
                claim_token=placement.token if placement is not None else None,
            )
            session.add(run)
            trial.state = TrialState.RUNNING
            trial.log_path = str(log_path)
            trial.started_at = trial.started_at or utcnow()
            session.flush()
            run_id, token = run.id, run.launch_token
            assert token is not None
            warm_job_id: int | None = None
            if warm is not None:
                warm_job_id = warm.id
            elif ctx.config.resources.reuse_workers and placement is not None:
                warm_job_id = warm_jobs.open_job(
                    session, run, placement, experiment_id=ctx.experiment_id
                )
            spec = build_runtime_spec(
                ctx, trial, attempt, checkpoint, log_path=log_path, warm_job_id=warm_job_id
            )
            spec_json = spec.model_dump_json(exclude={"db_url"})
            run.spec = json.loads(spec_json)
            if warm is not None and idle is not None:
                warm_jobs.hand_over(session, warm.id, run, run.spec)
                idle.job.record(session, run)
            optuna_number, slots = trial.optuna_trial_number, trial.slots_per_trial
            restored_step = checkpoint.step if checkpoint else None
            _, dropped = per_slot_batch_size(int(trial.hparams["global_batch_size"]), slots)
            if dropped and attempt == 0:
                warnings.warn(
                    f"trial {ctx.label(trial.optuna_trial_number)}: global_batch_size "
                    f"{trial.hparams['global_batch_size']} "
                    f"is not divisible by slots_per_trial {slots}; "
                    f"{dropped} samples per batch are dropped",
                    stacklevel=1,
                )
        where = (
            ", ".join(
                f"{part.agent.name} slots {','.join(str(slot) for slot in part.slots)}"
                for part in placement.agents
            )
            if placement is not None
            else f"nodes the {ctx.executor.name} executor's cluster picks"
        )
        write_log_line(
            log_path,
            f"trial {ctx.label(optuna_number)} attempt {attempt} on {where}"
            + (f" (warm job {warm_job_id}, already running)" if idle is not None else "")
            + (f", restoring the checkpoint of step {restored_step}" if restored_step else ""),
        )
        if idle is not None:
            # The ranks are running: rank 0 takes the spec from the job's row.
            del self._idle[idle.job_id]
            self._running[trial_id] = _Running(
                trial_id=trial_id,
                optuna_number=optuna_number,
                attempt=attempt,
                slots=slots,
                job=idle.job,
                started=time.monotonic(),
                run_id=run_id,
                warm_job_id=idle.job_id,
            )
            return
        request = LaunchRequest(
            placement=placement,
            slots=slots,
            spec_json=spec_json,
            rdzv_id=f"slotsweep-{trial_id}-{attempt}",
            token=token,
            log_path=log_path,
            cwd=ctx.model_dir,
            env={DB_URL_ENV_VAR: ctx.db_url},
        )
        if placement is not None:
            self._confirm_before_start(trial_id, placement, run_id)
        try:
            job = ctx.executor.launch(request)
        except BaseException:
            with session_scope(ctx.db_url) as session:
                failed = session.get(TrialRun, run_id)
                assert failed is not None
                end_run(session, failed, reason="launch failed")
            raise

        def record() -> None:
            with session_scope(ctx.db_url) as session:
                started = session.get(TrialRun, run_id)
                assert started is not None
                job.record(session, started)

        try:
            # The processes run: what finds them must reach the database (the launch
            # token finds them after a crash, but not while this driver still owns them).
            retry_transient(record)
        except BaseException:
            job.end(grace_s=0.0)
            raise
        self._running[trial_id] = _Running(
            trial_id=trial_id,
            optuna_number=optuna_number,
            attempt=attempt,
            slots=slots,
            job=job,
            started=time.monotonic(),
            run_id=run_id,
            waiting=job.waiting_reason(),
            warm_job_id=warm_job_id,
        )
        if self._running[trial_id].waiting:
            write_log_line(log_path, self._running[trial_id].waiting or "")

    def _confirm_before_start(
        self, trial_id: int, placement: ClaimedPlacement, run_id: int
    ) -> None:
        """Right before the processes start: the run is not ended and its claim holds.

        Not what makes the launch safe (each rank checks both before it touches a
        device: ``storage.start_ranks``), but a driver stopped since it recorded the run
        starts nothing at all when it can tell. Raises
        :class:`~trials.coordination.allocations.ClaimLostError` with the run ended.
        """
        with session_scope(self.ctx.db_url) as session:
            run = session.get(TrialRun, run_id)
            assert run is not None
            if run.ended_at is None and slot_ledger.holds(
                session, trial_id, placement, placement.token
            ):
                return
            run.reason = run.reason or "its slot claim was lost before its launch"
            end_run(session, run)
            trial = session.get(Trial, trial_id)
            assert trial is not None
            trial.state = TrialState.QUEUED
        raise ClaimLostError(trial_id, placement)

    def _check_reserved_job(self, trial_id: int) -> None:
        """Make sure a warm job reserved for ``trial_id`` is one this driver holds idle.

        A decision may reserve a job whose trial handed it back after this tick's reap:
        that hand-back is recorded now, and the trial goes onto the job. A job that no
        attempt of this driver ran (a new driver ends every warm job left before it
        starts anything) is asked to end, and the trial waits until its slots are freed.
        """
        with session_scope(self.ctx.db_url) as session:
            warm = warm_jobs.reserved_job(session, trial_id)
            if warm is None or warm.id in self._idle:
                return
            handed_back = next(
                (
                    running
                    for running in self._running.values()
                    if running.warm_job_id == warm.id and warm.current_run_id != running.run_id
                ),
                None,
            )
            if handed_back is None:
                warm_jobs.request_end(session, warm.id, "its driver does not run it")
        if handed_back is not None:
            self._record_hand_back(handed_back)
            return
        raise EarlierAttemptRunning(
            f"trial {trial_id} waits: the warm job reserved for it is ending"
        )

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
        jobs = [*self._idle, *(r.warm_job_id for r in placed if r.warm_job_id is not None)]
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
        for idle in list(self._idle.values()):
            if by_job.get(idle.job_id, 0) < idle.slots:
                self._close_idle(idle, "its slots were reclaimed while its driver was stopped")

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
        handed_back = self._warm_handed_back()
        for trial_id, running in list(self._running.items()):
            exit_code = running.job.poll()
            if exit_code is None and running.run_id in handed_back:
                self._record_hand_back(running)
                continue
            if exit_code is None:
                if running.waiting is not None:
                    self._follow_queued(running)
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
            del self._running[trial_id]
        self._reap_idle()
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
                if self._warm_handed_back():
                    return
            except Exception as exc:
                # The tick rides out a database outage; waiting here need not.
                if not is_transient_error(exc):
                    raise
                time.sleep(max(0.0, deadline - time.monotonic()))
                return

    # ----------------------------------------------------------------- warm jobs
    def _warm_handed_back(self) -> set[int]:
        """Runs on warm jobs whose ranks handed the job back (the job is idle now)."""
        runs = {r.warm_job_id: r.run_id for r in self._running.values() if r.warm_job_id}
        if not runs:
            return set()
        with session_scope(self.ctx.db_url) as session:
            current = dict(
                session.execute(
                    select(WarmJob.id, WarmJob.current_run_id).where(WarmJob.id.in_(list(runs)))
                ).all()
            )
        return {run_id for job_id, run_id in runs.items() if current.get(job_id) != run_id}

    def _record_hand_back(self, running: _Running) -> None:
        """The trial on a warm job ended (finished or pruned) and its ranks stay for the next.

        The attempt moves from the running ones to the idle jobs once its outcome is
        committed.
        """
        assert running.warm_job_id is not None
        elapsed = time.monotonic() - running.started
        with session_scope(self.ctx.db_url) as session:
            trial = session.get(Trial, running.trial_id)
            run = session.get(TrialRun, running.run_id)
            assert trial is not None and run is not None
            trial.slot_seconds = (trial.slot_seconds or 0.0) + elapsed * running.slots
            run.exit_code = trial.exit_code = 0
            # Its processes live on as the warm job's (their rows end at the next hand-over).
            run.ended_at = utcnow()
            run.reason = run.reason or "ended; its ranks wait warm for the next trial"
            log_path = Path(trial.log_path or self.ctx.run_dir / "warm.log")
            self._decided += self.outcomes.finalize(session, trial, exit_code=0)
        self._idle[running.warm_job_id] = _IdleJob(
            job_id=running.warm_job_id, job=running.job, slots=running.slots, log_path=log_path
        )
        del self._running[running.trial_id]

    def _reap_idle(self) -> None:
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
                self._close_idle(idle, asked.get(job_id))

    def _close_idle(self, idle: _IdleJob, reason: str | None) -> None:
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

    def end_unneeded_warm_jobs(self, waiting_sizes: set[int]) -> None:
        """Ask the idle jobs that no waiting trial of this experiment can use to end.

        Runs after the tick's placement: a job still idle then was not handed a trial,
        and one whose size no trial of this search waits for would only hold slots.
        """
        unneeded = [
            idle
            for idle in self._idle.values()
            if idle.ending_since is None and idle.slots not in waiting_sizes
        ]
        if not unneeded:
            return
        with session_scope(self.ctx.db_url) as session:
            for idle in unneeded:
                warm_jobs.request_end(session, idle.job_id, "no trial of its shape waits")

    def end_warm_jobs(self, reason: str) -> None:
        """Ask every idle warm job to end (the search pauses, ends or is killed)."""
        if not self._idle:
            return
        with session_scope(self.ctx.db_url) as session:
            for idle in self._idle.values():
                warm_jobs.request_end(session, idle.job_id, reason)

    def _follow_queued(self, running: _Running) -> None:
        """Note when an attempt queued in the cluster engine starts (or why it still waits).

        Its clock (slot-seconds, start-up and hang timeouts) starts then, not at submission.
        """
        reason = running.job.waiting_reason()
        if reason == running.waiting:
            return
        running.waiting = reason
        with session_scope(self.ctx.db_url) as session:
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

    def _record_exit(self, running: _Running, exit_code: int) -> None:
        elapsed = 0.0 if running.waiting else time.monotonic() - running.started
        ending = running.job.ending()
        with session_scope(self.ctx.db_url) as session:
            trial = session.get(Trial, running.trial_id)
            run = session.get(TrialRun, running.run_id)
            assert trial is not None and run is not None
            trial.slot_seconds = (trial.slot_seconds or 0.0) + elapsed * running.slots
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
        timeout_s = self.ctx.config.hang_timeout_s
        if not self._running:
            return
        # Until rank 0 first records anything (it does once the process group has
        # formed), start-up is measured: imports, rendezvous and DDP set-up take
        # seconds, minutes on a loaded machine, and are no hang.
        startup_s = max(timeout_s or 0.0, self.ctx.timings.startup_allowance_s)
        # An attempt still queued in its cluster engine has no process to hang.
        by_run = {r.run_id: r for r in self._running.values() if r.waiting is None}
        if not by_run:
            return
        with session_scope(self.ctx.db_url) as session:
            rows = session.execute(
                select(
                    TrialRun.id, TrialRun.started_at, TrialRun.progress_at, TrialRun.stop_reason
                ).where(TrialRun.id.in_(list(by_run)))
            ).all()
        now = utcnow()
        for run_id, started_at, progress_at, stop_reason in rows:
            running = by_run[run_id]
            if stop_reason and running.preempted_by_cluster_at is None:
                running.preempted_by_cluster_at = time.monotonic()
                _log.info("trial %s: %s", self.ctx.label(running.optuna_number), stop_reason)
            if timeout_s is None:
                continue
            if progress_at is None:
                idle_s = (now - started_at).total_seconds()
                hung = idle_s > startup_s
                what = f"did not start within {idle_s:.0f} s"
            else:
                idle_s = (now - max(started_at, progress_at)).total_seconds()
                hung = idle_s > timeout_s
                what = f"no progress for {idle_s:.0f} s"
            if running.hang_reason is None and hung:
                running.hang_reason = f"{what} (hang_timeout_s {timeout_s:g}); ended"
                _log.warning(
                    "trial %s: %s", self.ctx.label(running.optuna_number), running.hang_reason
                )
                running.job.end(grace_s=0.0)

    def preempt(self) -> None:
        """Ask every running attempt to checkpoint and stop (a pause); each is asked once."""
        self.end_warm_jobs("the search pauses")
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
        for idle in list(self._idle.values()):
            self._close_idle(idle, "the search stopped")
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
    for run in open_runs(session, trial.id):
        gone = end_run(
            session,
            run,
            reason="driver stopped; trial continues from its latest checkpoint",
            grace_s=ctx.timings.kill_grace_s,
        )
        if not gone:
            hosts = sorted({node.get("host", "?") for node in run.agents or []})
            raise UsageError(
                f"trial {ctx.label(trial.optuna_trial_number)}: attempt {run.attempt} "
                "still has processes on "
                f"{', '.join(hosts)} that this machine cannot end; end them, then resume"
            )
    slot_ledger.release(session, trial.id)


def _latest_checkpoint(session: Session, trial_id: int) -> Checkpoint | None:
    return session.scalars(
        select(Checkpoint)
        .where(Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.COMPLETED)
        .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
    ).first()
