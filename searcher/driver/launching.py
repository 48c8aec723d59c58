"""Starting a trial's attempt: its run row first, then its log line, then its processes.

:class:`AttemptStarter` does the three steps :meth:`searcher.driver.running.RunningTrials.launch`
takes for each placement. :meth:`AttemptStarter.record` confirms the slot claim behind
the placement and writes the run row in one transaction
(:func:`trials.coordination.allocations.confirm_claim`: a claim lost while this driver was
stopped records nothing), so that the launch token finds every process started from
then on, should the driver die. :meth:`AttemptStarter.start_processes` checks the claim
once more and starts the processes through the executor seam
(:mod:`trials.executors`), recording what finds them. An attempt on an idle warm job
starts no process: the job's running ranks take its spec from the job's row.

Two attempts of a trial never overlap: an earlier one not confirmed gone raises
:class:`EarlierAttemptRunning` and the trial waits.

A launch that raised is settled here too (:func:`settle_failed_launch`): a trial that
started nothing goes back to the pending queue (a :class:`~searcher.driver.decisions.Requeue`),
one whose launch failed for good is failed. When a transient database error stops the
launches, the placements not tried yet give their claims back (:func:`release_claims`).

The running attempts use it so (this starts processes, so it is not run as an
example; the end-to-end tests run it)::

    starter = AttemptStarter(ctx, warm)
    attempt, job = starter.start(trial_id, placement)
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.driver.context import DriverContext, driver_log
from searcher.driver.decisions import Decision, Requeue
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import Placed
from searcher.driver.runtime_spec import build_runtime_spec
from searcher.driver.study_side import missing_hparams
from searcher.driver.warm import IdleJob, IdleWarmJobs
from storage import (
    Checkpoint,
    CheckpointState,
    Trial,
    TrialRun,
    TrialState,
    is_transient_error,
    retry_transient,
    session_scope,
    utcnow,
)
from trials import per_slot_batch_size
from trials.config import format_share
from trials.coordination import allocations as slot_ledger
from trials.coordination import warm_jobs
from trials.coordination.allocations import ClaimedPlacement, ClaimLostError
from trials.coordination.attempts import end_run, open_runs
from trials.executors import LaunchRequest, TrialJob
from trials.labels import trial_log_name
from trials.launch.launcher import DB_URL_ENV_VAR, write_log_line


class EarlierAttemptRunning(RuntimeError):
    """The trial's previous attempt is not confirmed gone yet (a node that does not
    answer, a step Slurm has not cleaned up): the next attempt waits for it."""


@dataclass(frozen=True)
class Attempt:
    """An attempt whose run row is written, as :meth:`AttemptStarter.record` starts it."""

    trial_id: int
    optuna_number: int
    attempt: int
    slots: int
    run_id: int
    #: The launch token that finds every process of the attempt.
    token: str
    log_path: Path
    spec_json: str
    warm_job_id: int | None
    #: The idle warm job whose running ranks take the attempt, if one was reserved.
    idle: IdleJob | None
    restored_step: int | None
    #: The share of its slot the trial runs on (1.0: whole slots); its compute counts at it.
    share: float = 1.0


class AttemptStarter:
    """Records and starts attempts of this driver's trials (see the module's docstring)."""

    def __init__(self, ctx: DriverContext, warm: IdleWarmJobs) -> None:
        self.ctx = ctx
        #: This driver's idle warm jobs: an attempt reserved one runs on its ranks.
        self.warm = warm

    def start(self, trial_id: int, placement: ClaimedPlacement | None) -> tuple[Attempt, TrialJob]:
        """Record, log and start the trial's next attempt; returns it and the job that runs it.

        An attempt on an idle warm job starts no process: the job is taken from the idle
        ones, and its running ranks take the attempt.
        """
        attempt = self.record(trial_id, placement)
        self.log_start(attempt, placement)
        if attempt.idle is not None:
            # The ranks are running: rank 0 takes the spec from the job's row.
            self.warm.take(attempt.idle.job_id, handed_run_id=attempt.run_id)
            return attempt, attempt.idle.job
        return attempt, self.start_processes(attempt, placement)

    def check_reserved_job(self, trial_id: int, warm_runs: Mapping[int, int | None]) -> int | None:
        """Make sure a warm job reserved for ``trial_id`` is one this driver holds idle.

        ``warm_runs`` maps the run of each attempt this driver runs to its warm job. A
        decision may reserve a job whose trial handed it back after this tick's reap: the
        run that handed it back is returned, for its hand-back to be recorded now, and
        the trial goes onto the job. A job that no attempt of this driver ran (a new
        driver ends every warm job left before it starts anything) is asked to end, and
        the trial waits until its slots are freed (:class:`EarlierAttemptRunning`).
        """
        with session_scope(self.ctx.db_url) as session:
            warm = warm_jobs.reserved_job(session, trial_id)
            if warm is None or warm.id in self.warm:
                return None
            handed_back = next(
                (
                    run_id
                    for run_id, job_id in warm_runs.items()
                    if job_id == warm.id and warm.current_run_id != run_id
                ),
                None,
            )
            if handed_back is None:
                warm_jobs.request_end(session, warm.id, "its driver does not run it")
        if handed_back is not None:
            return handed_back
        raise EarlierAttemptRunning(
            f"trial {trial_id} waits: the warm job reserved for it is ending"
        )

    def record(self, trial_id: int, placement: ClaimedPlacement | None) -> Attempt:
        """Confirm the claim and write the attempt's run row, before any process starts."""
        ctx = self.ctx
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
            idle = self.warm.get(warm.id) if warm is not None else None
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
            assert run.launch_token is not None
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
            _warn_dropped_samples(ctx, trial, attempt)
            return Attempt(
                trial_id=trial_id,
                optuna_number=trial.optuna_trial_number,
                attempt=attempt,
                slots=trial.slots_per_trial,
                run_id=run.id,
                token=run.launch_token,
                log_path=log_path,
                spec_json=spec_json,
                warm_job_id=warm_job_id,
                idle=idle,
                restored_step=checkpoint.step if checkpoint else None,
                share=ctx.config.resources.slot_share,
            )

    def adopt(self, trial_id: int, run_id: int, warm_job_id: int) -> tuple[Attempt, float]:
        """The attempt that rank 0 of warm job ``warm_job_id`` started itself, and its age in s.

        Its trial was decided ahead for the job (:mod:`searcher.driver.handoff`) and rank 0
        wrote its run at the hand-back: the driver takes it over as it would an attempt
        it started on the job, its log's first line included.
        """
        ctx = self.ctx
        with session_scope(ctx.db_url) as session:
            trial = session.get(Trial, trial_id)
            run = session.get(TrialRun, run_id)
            assert trial is not None and run is not None and run.launch_token is not None
            attempt = Attempt(
                trial_id=trial_id,
                optuna_number=trial.optuna_trial_number,
                attempt=run.attempt,
                slots=trial.slots_per_trial,
                run_id=run.id,
                token=run.launch_token,
                log_path=Path(trial.log_path or ctx.run_dir / "warm.log"),
                spec_json=json.dumps(run.spec),
                warm_job_id=warm_job_id,
                idle=None,
                restored_step=run.restored_from_step,
                share=ctx.config.resources.slot_share,
            )
            where = _placed_on((node["agent"], node["slots"]) for node in run.agents or [])
            age_s = max(0.0, (utcnow() - run.started_at).total_seconds())
            _warn_dropped_samples(ctx, trial, run.attempt)
        self._write_start_line(attempt, where, already_running=True)
        return attempt, age_s

    def log_start(self, attempt: Attempt, placement: ClaimedPlacement | None) -> None:
        """The attempt's first line in the trial's log: where it runs, what it restores."""
        where = (
            _placed_on((part.agent.name, part.slots) for part in placement.agents)
            if placement is not None
            else f"nodes the {self.ctx.executor.name} executor's cluster picks"
        )
        if placement is not None and placement.share < 1.0:
            where += f" ({format_share(placement.share)} of the slot, shared)"
        self._write_start_line(attempt, where, already_running=attempt.idle is not None)

    def _write_start_line(self, attempt: Attempt, where: str, *, already_running: bool) -> None:
        restored_step = attempt.restored_step
        write_log_line(
            attempt.log_path,
            f"trial {self.ctx.label(attempt.optuna_number)} attempt {attempt.attempt} on {where}"
            + (f" (warm job {attempt.warm_job_id}, already running)" if already_running else "")
            + (f", restoring the checkpoint of step {restored_step}" if restored_step else ""),
        )

    def start_processes(self, attempt: Attempt, placement: ClaimedPlacement | None) -> TrialJob:
        """Start the attempt's processes through the executor and record what finds them."""
        ctx = self.ctx
        run_id = attempt.run_id
        request = LaunchRequest(
            placement=placement,
            slots=attempt.slots,
            spec_json=attempt.spec_json,
            rdzv_id=f"slotsweep-{attempt.trial_id}-{attempt.attempt}",
            token=attempt.token,
            log_path=attempt.log_path,
            cwd=ctx.model_dir,
            env={DB_URL_ENV_VAR: ctx.db_url},
        )
        if placement is not None:
            self._confirm_before_start(attempt.trial_id, placement, run_id)
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
        return job

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


def settle_failed_launch(
    ctx: DriverContext, outcomes: Outcomes, placed: Placed, exc: Exception
) -> list[Decision] | None:
    """What becomes of the trial whose launch raised ``exc``; None for a transient error.

    A claim lost between the decision and the launch, or an earlier attempt still
    running, started nothing: the trial waits for a new placement (a
    :class:`~searcher.driver.decisions.Requeue`). A transient database error returns None: nothing
    was started (the run's row comes first), and the caller retries the tick. Any other
    failure releases the slots and fails the trial.
    """
    if isinstance(exc, ClaimLostError):
        # This driver was stopped between the decision and the launch, and the
        # claim was reclaimed (or released by a resume) meanwhile: the slots may be
        # another trial's now. Nothing started; the trial waits for a new placement.
        driver_log.warning("%s; nothing started, the trial waits for a new placement", exc)
        assert placed.placement is not None
        with session_scope(ctx.db_url) as session:
            slot_ledger.release_claim(session, placed.trial_id, placed.placement.token)
        return [Requeue(trial_id=placed.trial_id, slots=placed.slots)]
    if isinstance(exc, EarlierAttemptRunning):
        # Not a failure of the trial: it waits, its slots go back meanwhile.
        driver_log.warning("%s", exc)
        with session_scope(ctx.db_url) as session:
            slot_ledger.release(session, placed.trial_id)
        return [Requeue(trial_id=placed.trial_id, slots=placed.slots)]
    if is_transient_error(exc):
        return None
    with session_scope(ctx.db_url) as session:
        slot_ledger.release(session, placed.trial_id)
        trial = session.get(Trial, placed.trial_id)
        assert trial is not None
        outcomes.launch_failed(trial, exc)
    return []


def release_claims(ctx: DriverContext, placed: Sequence[Placed]) -> None:
    """Give back the slots claimed for ``placed``, whose launches were not tried."""
    claimed = [each.trial_id for each in placed if each.placement is not None]
    if not claimed:
        return
    with session_scope(ctx.db_url) as session:
        for trial_id in claimed:
            slot_ledger.release(session, trial_id)


def _warn_dropped_samples(ctx: DriverContext, trial: Trial, attempt: int) -> None:
    """Warn once (first attempt) when ``global_batch_size`` does not split evenly over the slots."""
    slots = trial.slots_per_trial
    _, dropped = per_slot_batch_size(int(trial.hparams["global_batch_size"]), slots)
    if dropped and attempt == 0:
        warnings.warn(
            f"trial {ctx.label(trial.optuna_trial_number)}: global_batch_size "
            f"{trial.hparams['global_batch_size']} "
            f"is not divisible by slots_per_trial {slots}; "
            f"{dropped} samples per batch are dropped",
            stacklevel=1,
        )


def _placed_on(parts: Iterable[tuple[str, Sequence[int]]]) -> str:
    """Where an attempt runs, as its log's first line says it: ``a0 slots 0,1, a1 slots 0``."""
    return ", ".join(
        f"{agent} slots {','.join(str(slot) for slot in slots)}" for agent, slots in parts
    )


def _latest_checkpoint(session: Session, trial_id: int) -> Checkpoint | None:
    return session.scalars(
        select(Checkpoint)
        .where(Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.COMPLETED)
        .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
    ).first()
