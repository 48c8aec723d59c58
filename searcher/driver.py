"""The search driver: ask Optuna, place trials on slots, run them, tell Optuna.

One driver owns an experiment at a time (its heartbeat is in the experiment row).
Everything it knows is in the database, so :meth:`SearchDriver.run` serves a new
search and a resumed one alike: finished trials stay finished, interrupted trials
continue from their latest checkpoint, and the Optuna study goes on to
``max_trials``.

Example:
    >>> driver = SearchDriver(experiment_id, db_url=url, cluster=load_cluster())  # doctest: +SKIP
    >>> driver.run()  # doctest: +SKIP
    <ExperimentState.COMPLETED: 'COMPLETED'>
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import socket
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from sqlalchemy import make_url, select

from searcher import samplers, space
from searcher.config import ExperimentConfig
from searcher.experiments import UsageError, driver_alive, trial_counts
from searcher.failures import (
    FailureRecord,
    RunVerdict,
    TrialOutcome,
    fail_fast_reason,
    judge_run,
)
from searcher.progress import SearchProgress
from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    TrialFailure,
    TrialRun,
    TrialState,
    absolute_db_url,
    is_transient_error,
    optuna_storage,
    retry_transient,
    session_scope,
    utcnow,
)
from storage._engine import TRANSIENT_DEADLINE_S, DatabaseUnavailableError
from trials import RuntimeSpec, per_slot_batch_size
from trials import allocations as slot_ledger
from trials._system_metrics import detect_gpus
from trials.attempts import end_run, open_runs, request_stop, trial_processes_gone
from trials.executors import Executor, LaunchRequest, TrialJob, executor_for
from trials.labels import trial_label, trial_log_name
from trials.launcher import DB_URL_ENV_VAR, write_log_line
from trials.retention import collect_garbage
from trials.scheduler import Cluster, Placement, SlotRequest, check_schedulable, schedule

if TYPE_CHECKING:
    import optuna

_log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 2.0
LEASE_S = 30.0
# A preempted trial gets this long to checkpoint and exit before it is killed.
PREEMPT_GRACE_S = 120.0
# Before its first record a run gets at least this long (see _end_hung_trials).
STARTUP_ALLOWANCE_S = 120.0
# A killed trial gets this long after SIGTERM (rank 0 commits what it queued).
KILL_GRACE_S = 10.0


@dataclass
class _Running:
    trial_id: int
    optuna_number: int
    attempt: int
    slots: int
    job: TrialJob
    started: float
    run_id: int
    preempted_at: float | None = None
    # Set when the driver ended the run for making no progress (hang_timeout_s).
    hang_reason: str | None = None


@dataclass
class _Pending:
    trial_id: int
    slots: int
    order: int
    priority: int


@dataclass
class _Control:
    """What Ctrl-C and ``slotsweep pause|kill`` asked for."""

    interrupts: int = 0
    action: str | None = None  # "pause", "kill", or "error" (the experiment must stop)
    handlers: dict[int, Any] = field(default_factory=dict)


class SearchDriver:
    """Runs (or resumes) one experiment until it completes, pauses or is killed."""

    def __init__(
        self,
        experiment_id: int,
        *,
        db_url: str,
        cluster: Cluster,
        poll_interval_s: float = 0.2,
        show_progress: bool = True,
    ) -> None:
        self.db_url = absolute_db_url(db_url)
        self.cluster = cluster
        self.poll_interval_s = poll_interval_s
        self.show_progress = show_progress
        with session_scope(self.db_url) as session:
            experiment = session.get(Experiment, experiment_id)
            if experiment is None:
                raise UsageError(f"experiment: no experiment with id {experiment_id}")
            self.experiment_id = experiment.id
            self.study_name = experiment.study_name
            self.model_dir = Path(experiment.model_dir)
            self.config = ExperimentConfig.model_validate(experiment.config)
        self.pool = cluster.pool(self.config.resources.resource_pool)
        for slots in self.config.possible_slots_per_trial():
            check_schedulable(self.pool, slots)
        self._running: dict[int, _Running] = {}
        self._pending: list[_Pending] = []
        self._control = _Control()
        self._stop_reason = ""
        self._run_dir = self._logs_root() / f"experiment-{self.experiment_id}"
        # Slots are GPU indices where the cluster says so, else exactly when this
        # machine has GPUs (NVML finds them).
        use_gpus = cluster.gpu_slots if cluster.gpu_slots is not None else bool(detect_gpus())
        self.executor: Executor = executor_for(cluster, use_gpus=use_gpus)
        if self.executor.remote and make_url(self.db_url).get_backend_name() == "sqlite":
            raise UsageError(
                f"database: SQLite cannot be shared by the {self.executor.name} executor's "
                "nodes (a file on a network filesystem corrupts under concurrent writers); "
                "use PostgreSQL: --db postgresql+psycopg://USER@HOST/DB"
            )
        self._study: optuna.Study | None = None
        self._tells: list[tuple[int, list[float] | None, optuna.trial.TrialState | None]] = []

    # ----------------------------------------------------------------- set-up
    def _logs_root(self) -> Path:
        return Path(os.environ.get("SLOTSWEEP_LOG_DIR", "slotsweep_logs")).resolve()

    def _checkpoint_root(self) -> Path:
        path = Path(self.config.checkpoint_storage.path)
        return path if path.is_absolute() else (self.model_dir / path).resolve()

    def _max_trials(self) -> int:
        limit = self.config.searcher.max_trials
        if self.config.searcher.name == "grid":
            limit = min(limit, space.grid_size(self.config.hyperparameters))
        return limit

    def _load_study(self, trials_so_far: int) -> optuna.Study:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.load_study(
            study_name=self.study_name,
            storage=optuna_storage(self.db_url),
            sampler=samplers.build_sampler(self.config, trials_so_far=trials_so_far),
            pruner=samplers.build_pruner(self.config),
        )

    def _claim_ownership(self) -> None:
        with session_scope(self.db_url) as session:
            experiment = session.get(Experiment, self.experiment_id)
            assert experiment is not None
            if experiment.state.is_terminal:
                raise UsageError(
                    f"experiment: '{experiment.name}' (id {experiment.id}) is "
                    f"{experiment.state.value}; it cannot run again"
                    + (
                        f" (`slotsweep continue {experiment.id} --more-trials K` extends it)"
                        if experiment.state == ExperimentState.COMPLETED
                        else ""
                    )
                )
            if driver_alive(experiment) and experiment.driver_pid != os.getpid():
                raise UsageError(
                    f"experiment: '{experiment.name}' (id {experiment.id}) is being run by "
                    f"pid {experiment.driver_pid} on {experiment.driver_host}"
                )
            experiment.state = ExperimentState.ACTIVE
            experiment.requested_action = None
            experiment.driver_host = socket.gethostname()
            experiment.driver_pid = os.getpid()
            experiment.driver_heartbeat_at = utcnow()

    def _recover(self) -> None:
        """Rebuild the queue from the database after a crash, pause or first start."""
        assert self._study is not None
        import optuna

        with session_scope(self.db_url) as session:
            trials = list(
                session.scalars(
                    select(Trial)
                    .where(Trial.experiment_id == self.experiment_id)
                    .order_by(Trial.id)
                )
            )
            known_numbers = {t.optuna_trial_number for t in trials}
            for trial in trials:
                self._end_leftovers(session, trial)
        # Trials asked from Optuna whose row was never written (driver died in between)
        # are adopted rather than lost, if they had all their values by then.
        for frozen in self._study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)
        ):
            if frozen.number not in known_numbers:
                self._adopt(frozen)
        with session_scope(self.db_url) as session:
            for trial in session.scalars(
                select(Trial)
                .where(Trial.experiment_id == self.experiment_id)
                .where(Trial.state.in_([TrialState.QUEUED, TrialState.RUNNING]))
                .order_by(Trial.id)
            ):
                if trial.finished_at or trial.pruned_at:
                    # It finished while no driver was watching: only Optuna is not told.
                    self._finalize_outcome(session, trial, exit_code=None)
                    continue
                trial.state = TrialState.QUEUED
                self._queue(trial)
        self._reconcile_optuna()
        self._flush_tells()

    def _reconcile_optuna(self) -> None:
        """Tell Optuna outcomes that were recorded here just before a crash."""
        import optuna

        assert self._study is not None
        unfinished = {
            t.number
            for t in self._study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)
            )
        }
        with session_scope(self.db_url) as session:
            for trial in session.scalars(
                select(Trial).where(
                    Trial.experiment_id == self.experiment_id,
                    Trial.optuna_trial_number.in_(unfinished),
                    Trial.state.in_([TrialState.COMPLETED, TrialState.PRUNED, TrialState.ERROR]),
                )
            ):
                self._record_outcome_for_optuna(trial)

    def _record_outcome_for_optuna(self, trial: Trial) -> None:
        import optuna

        if trial.state == TrialState.COMPLETED:
            self._tell(trial, values=self._objective_values(trial))
        elif trial.state == TrialState.PRUNED:
            self._tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self._tell(trial, state=optuna.trial.TrialState.FAIL)

    def _end_leftovers(self, session: Any, trial: Trial) -> None:
        """End every process a dead driver left running for ``trial``, then free its slots.

        The leftover attempt is over before anything else happens to the trial: its
        next attempt never overlaps it, and its slots are released only once it is gone.
        """
        for run in open_runs(session, trial.id):
            gone = end_run(
                session,
                run,
                reason="driver stopped; trial continues from its latest checkpoint",
                grace_s=KILL_GRACE_S,
            )
            if not gone:
                hosts = sorted({node.get("host", "?") for node in run.agents or []})
                raise UsageError(
                    f"trial {self._label(trial.optuna_trial_number)}: attempt {run.attempt} "
                    "still has processes on "
                    f"{', '.join(hosts)} that this machine cannot end; end them, then resume"
                )
        slot_ledger.release(session, trial.id)

    def _label(self, number: int) -> str:
        return trial_label(self.experiment_id, number)

    def _missing_hparams(self, hparams: dict[str, Any]) -> list[str]:
        return sorted(set(self.config.hyperparameters) - set(hparams))

    def _adopt(self, frozen: optuna.trial.FrozenTrial) -> None:
        import optuna

        assert self._study is not None
        hparams = dict(frozen.params)
        for name, hp in self.config.hyperparameters.items():
            if getattr(hp, "type", None) == "const":
                hparams.setdefault(name, hp.val)  # type: ignore[union-attr]
        missing = self._missing_hparams(hparams)
        if missing:
            # Asked but never given all its values (a crash between ask and the
            # suggestions): running it would train with settings nobody chose.
            _log.warning(
                "trial %s has no value for %s; it is failed and replaced",
                self._label(frozen.number),
                ", ".join(missing),
            )
            self._study.tell(
                frozen.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True
            )
            return
        with session_scope(self.db_url) as session:
            session.add(self._new_trial_row(frozen.number, frozen._trial_id, hparams))

    def _new_trial_row(self, number: int, optuna_id: int, hparams: dict[str, Any]) -> Trial:
        slots = int(hparams.get("slots_per_trial", self.config.resources.slots_per_trial))
        return Trial(
            experiment_id=self.experiment_id,
            optuna_trial_id=optuna_id,
            optuna_trial_number=number,
            state=TrialState.QUEUED,
            hparams=hparams,
            slots_per_trial=slots,
        )

    def _write_trial_row(self, number: int, optuna_id: int, hparams: dict[str, Any]) -> Trial:
        with session_scope(self.db_url) as session:
            trial = self._new_trial_row(number, optuna_id, hparams)
            session.add(trial)
        return trial

    def _queue(self, trial: Trial) -> None:
        if any(p.trial_id == trial.id for p in self._pending):
            return  # queued by a tick whose transaction was retried
        self._pending.append(
            _Pending(
                trial_id=trial.id,
                slots=trial.slots_per_trial,
                order=trial.id,
                priority=self.config.resources.priority,
            )
        )

    # ----------------------------------------------------------------- main loop
    def run(self) -> ExperimentState:
        """Drive the search to its end; returns the experiment's final state."""
        self._claim_ownership()
        with session_scope(self.db_url) as session:
            trials_so_far = trial_counts(session, self.experiment_id).total
        self._study = self._load_study(trials_so_far)
        self._recover()
        progress = SearchProgress(
            total=self._max_trials(),
            enabled=self.show_progress,
            metric=self.config.searcher.metric,
        )
        self._install_signal_handlers()
        final: ExperimentState | None = None
        self._last_heartbeat = 0.0
        outage_since: float | None = None
        try:
            with progress:
                while final is None:
                    try:
                        final = self._tick(progress)
                        outage_since = None
                    except Exception as exc:
                        # A database restart (PostgreSQL) or a writer holding SQLite past
                        # the busy timeout: keep the trials running and try again; every
                        # tick's writes are whole transactions, so a failed one left
                        # nothing half-done.
                        if not is_transient_error(exc):
                            raise
                        now = time.monotonic()
                        if outage_since is None:
                            outage_since = now
                            _log.warning("the database is unreachable; retrying: %s", exc)
                        elif now - outage_since > TRANSIENT_DEADLINE_S:
                            raise DatabaseUnavailableError(
                                f"the database was unreachable for {TRANSIENT_DEADLINE_S:g} s"
                            ) from exc
                        time.sleep(1.0)
                        continue
                    time.sleep(self.poll_interval_s)
                self._refresh_progress(progress)
        except BaseException:
            self._kill_running()
            self._finish(ExperimentState.PAUSED)
            raise
        finally:
            self._restore_signal_handlers()
        self._finish(final)
        return final

    def _tick(self, progress: SearchProgress) -> ExperimentState | None:
        """One round of the loop; the experiment's final state once it ends, else None."""
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_EVERY_S:
            self._heartbeat()
            self._end_hung_trials()
            self._last_heartbeat = now
        self._reap()
        self._flush_tells()
        if self._control.action in ("kill", "error"):
            self._kill_running()
            return (
                ExperimentState.CANCELED
                if self._control.action == "kill"
                else ExperimentState.ERROR
            )
        if self._control.action == "pause":
            self._preempt_running()
            if not self._running:
                return ExperimentState.PAUSED
        else:
            self._fill_queue()
            self._place()
            self._flush_tells()
            if not self._running and not self._pending and self._search_done():
                return self._completion_state()
        self._refresh_progress(progress)
        return None

    def _search_done(self) -> bool:
        return self._trials_left() <= 0

    def _trials_left(self) -> int:
        """Trials still to ask for: up to max_trials, plus any a user enqueued beyond it."""
        import optuna

        assert self._study is not None
        waiting = len(
            self._study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        )
        with session_scope(self.db_url) as session:
            total = trial_counts(session, self.experiment_id).total
        return max(self._max_trials() - total, waiting)

    def _fill_queue(self) -> None:
        """Ask Optuna for new trials while there is room to run them."""
        assert self._study is not None
        limit = self.config.searcher.max_concurrent_trials
        while len(self._running) + len(self._pending) < limit:
            if self._trials_left() <= 0:
                return
            optuna_trial = self._study.ask()
            try:
                hparams = space.suggest_hparams(optuna_trial, self.config.hyperparameters)
            except BaseException:
                # Never leave a trial without its values where resume would adopt it.
                import optuna

                self._study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
                raise

            # Asked from Optuna: its row must be written, or only a resume would find it.
            self._queue(
                retry_transient(
                    functools.partial(
                        self._write_trial_row,
                        optuna_trial.number,
                        optuna_trial._trial_id,
                        hparams,
                    )
                )
            )

    def _place(self) -> None:
        if not self._pending:
            return
        with session_scope(self.db_url) as session:
            slot_ledger.reclaim_stale(
                session,
                utcnow(),
                processes_gone=lambda trial_id: trial_processes_gone(session, trial_id),
            )
            free = slot_ledger.free_slots(session, self.pool)
        queue = [
            SlotRequest(request_id=p.trial_id, slots=p.slots, priority=p.priority, order=p.order)
            for p in self._pending
        ]
        for placement in schedule(self.pool, free, queue):
            pending = next(p for p in self._pending if p.trial_id == placement.request_id)
            with session_scope(self.db_url) as session:
                claimed = slot_ledger.claim(
                    session,
                    placement,
                    trial_id=pending.trial_id,
                    experiment_id=self.experiment_id,
                    lease_s=LEASE_S,
                )
            if not claimed:
                continue  # Another driver won those slots; try again next tick.
            self._pending.remove(pending)
            try:
                self._launch(pending.trial_id, placement)
            except Exception as exc:
                if is_transient_error(exc):
                    # Nothing was started (the run's row comes first); the next tick
                    # claims the slots again.
                    self._pending.append(pending)
                    raise
                with session_scope(self.db_url) as session:
                    slot_ledger.release(session, pending.trial_id)
                    trial = session.get(Trial, pending.trial_id)
                    assert trial is not None
                    trial.error = f"launch failed: {exc}"
                    self._fail(session, trial)

    def _launch(self, trial_id: int, placement: Placement) -> None:
        """Start the trial's next attempt on ``placement`` (its slots are claimed)."""
        with session_scope(self.db_url) as session:
            trial = session.get(Trial, trial_id)
            assert trial is not None
            missing = self._missing_hparams(trial.hparams)
            if missing:
                raise RuntimeError(
                    f"the trial has no value for hyperparameter(s) {', '.join(missing)}"
                )
            # Two attempts never overlap: whatever is left of an earlier one ends first.
            for earlier in open_runs(session, trial_id):
                if not end_run(session, earlier, reason="ended", grace_s=KILL_GRACE_S):
                    raise RuntimeError(
                        f"attempt {earlier.attempt} still has processes that could not be ended"
                    )
            attempt = len(trial.runs)
            checkpoint = self._latest_checkpoint(session, trial_id)
            log_path = Path(
                trial.log_path or self._run_dir / trial_log_name(trial.optuna_trial_number)
            )
            # Written before any process starts: a driver that dies from here on leaves
            # a run whose launch token finds every process it started.
            run = TrialRun(
                trial_id=trial_id,
                attempt=attempt,
                executor=self.executor.name,
                agents=[
                    {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
                    for part in placement.agents
                ],
                launch_token=uuid.uuid4().hex,
                restored_from_checkpoint=checkpoint.uuid if checkpoint else None,
                restored_from_step=checkpoint.step if checkpoint else None,
                reason=None if attempt == 0 else "continued",
            )
            session.add(run)
            trial.state = TrialState.RUNNING
            trial.log_path = str(log_path)
            trial.started_at = trial.started_at or utcnow()
            session.flush()
            run_id, token = run.id, run.launch_token
            assert token is not None
            spec = self._runtime_spec(trial, attempt, checkpoint)
            spec_json = spec.model_dump_json(exclude={"db_url"})
            run.spec = json.loads(spec_json)
            optuna_number, slots = trial.optuna_trial_number, trial.slots_per_trial
            restored_step = checkpoint.step if checkpoint else None
            _, dropped = per_slot_batch_size(int(trial.hparams["global_batch_size"]), slots)
            if dropped and attempt == 0:
                warnings.warn(
                    f"trial {self._label(trial.optuna_trial_number)}: global_batch_size "
                    f"{trial.hparams['global_batch_size']} "
                    f"is not divisible by slots_per_trial {slots}; "
                    f"{dropped} samples per batch are dropped",
                    stacklevel=1,
                )
        where = ", ".join(
            f"{part.agent.name} slots {','.join(str(slot) for slot in part.slots)}"
            for part in placement.agents
        )
        write_log_line(
            log_path,
            f"trial {self._label(optuna_number)} attempt {attempt} on {where}"
            + (f", restoring the checkpoint of step {restored_step}" if restored_step else ""),
        )
        request = LaunchRequest(
            placement=placement,
            spec_json=spec_json,
            rdzv_id=f"slotsweep-{trial_id}-{attempt}",
            token=token,
            log_path=log_path,
            cwd=self.model_dir,
            env={DB_URL_ENV_VAR: self.db_url},
        )
        try:
            job = self.executor.launch(request)
        except BaseException:
            with session_scope(self.db_url) as session:
                failed = session.get(TrialRun, run_id)
                assert failed is not None
                end_run(session, failed, reason="launch failed")
            raise

        def record() -> None:
            with session_scope(self.db_url) as session:
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
        )

    def _runtime_spec(
        self, trial: Trial, attempt: int, checkpoint: Checkpoint | None
    ) -> RuntimeSpec:
        config = self.config
        pruner = samplers.pruner_spec(config)
        return RuntimeSpec(
            db_url=self.db_url,
            experiment_id=self.experiment_id,
            trial_id=trial.id,
            study_name=self.study_name,
            optuna_trial_id=trial.optuna_trial_id,
            optuna_trial_number=trial.optuna_trial_number,
            attempt=attempt,
            entrypoint=config.entrypoint,
            model_dir=str(self.model_dir),
            hparams=trial.hparams,
            data=config.data,
            slots_per_trial=trial.slots_per_trial,
            max_length=config.searcher.max_length,
            searcher_metric=config.searcher.metric,
            smaller_is_better=config.searcher.smaller_is_better,
            pruning=pruner is not None,
            pruner=pruner,
            min_validation_period=config.min_validation_period,
            min_checkpoint_period=config.min_checkpoint_period,
            optimizations=config.optimizations,
            checkpoint_storage=config.checkpoint_storage.model_copy(
                update={"path": str(self._checkpoint_root())}
            ),
            profiling=config.profiling,
            scratch_dir=str(
                Path(tempfile.gettempdir())
                / "slotsweep"
                / f"experiment-{self.experiment_id}"
                / f"trial-{trial.id}"
            ),
            # Distinct per trial (as Determined does), reproducible from the experiment seed.
            seed=None
            if config.searcher.seed is None
            else config.searcher.seed + trial.optuna_trial_number,
            restore_checkpoint_path=checkpoint.path if checkpoint else None,
            agent=self.pool.agents[0].name,
        )

    @staticmethod
    def _latest_checkpoint(session: Any, trial_id: int) -> Checkpoint | None:
        return session.scalars(
            select(Checkpoint)
            .where(Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.COMPLETED)
            .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
        ).first()

    # ----------------------------------------------------------------- outcomes
    def _reap(self) -> None:
        for trial_id, running in list(self._running.items()):
            exit_code = running.job.poll()
            if exit_code is None:
                if (
                    running.preempted_at is not None
                    and time.monotonic() - running.preempted_at > PREEMPT_GRACE_S
                ):
                    running.job.end(grace_s=0.0)
                continue
            self._record_exit(running, exit_code)
            # Forgotten only once the outcome is committed: a tick that failed on the
            # database finds the exited run again and records it then.
            del self._running[trial_id]

    def _record_exit(self, running: _Running, exit_code: int) -> None:
        elapsed = time.monotonic() - running.started
        with session_scope(self.db_url) as session:
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
            if running.preempted_at is not None and not (trial.finished_at or trial.pruned_at):
                run.reason = "paused"
                trial.state = TrialState.QUEUED
                return
            self._finalize_outcome(session, trial, exit_code=exit_code, cause=running.hang_reason)

    def _end_hung_trials(self) -> None:
        """End runs whose rank 0 recorded no progress for ``hang_timeout_s``.

        A rank stuck in a collective, a dead NFS mount or a deadlocked data loader
        holds its slots forever otherwise; the run is ended and the trial restarted
        from its latest checkpoint like any other failure.
        """
        timeout_s = self.config.hang_timeout_s
        if timeout_s is None or not self._running:
            return
        # Until rank 0 first records anything (it does once the process group has
        # formed), start-up is measured: imports, rendezvous and DDP set-up take
        # seconds, minutes on a loaded machine, and are no hang.
        startup_s = max(timeout_s, STARTUP_ALLOWANCE_S)
        by_run = {running.run_id: running for running in self._running.values()}
        with session_scope(self.db_url) as session:
            rows = session.execute(
                select(TrialRun.id, TrialRun.started_at, TrialRun.progress_at).where(
                    TrialRun.id.in_(list(by_run))
                )
            ).all()
        now = utcnow()
        for run_id, started_at, progress_at in rows:
            running = by_run[run_id]
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
                    "trial %s: %s", self._label(running.optuna_number), running.hang_reason
                )
                running.job.end(grace_s=0.0)

    def _finalize_outcome(
        self, session: Any, trial: Trial, exit_code: int | None, cause: str | None = None
    ) -> None:
        """Decide COMPLETED / PRUNED / restart / FAIL from what the trial recorded.

        torchrun can exit non-zero after a finished run (gloo teardown), so the record,
        not the exit code, decides.
        """
        import optuna

        assert self._study is not None
        if trial.pruned_at is not None:
            trial.state = TrialState.PRUNED
            self._tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif trial.finished_at is not None and trial.searcher_metric_value is not None:
            trial.state = TrialState.COMPLETED
            self._tell(trial, values=self._objective_values(trial))
        elif trial.finished_at is not None:
            metric = self.config.searcher.metric
            trial.error = (
                f"the searcher metric '{metric}' was NaN at the end of training (it diverged)"
                if _last_validation_is_nan(session, trial.id, metric)
                else f"the trial finished without reporting the searcher metric '{metric}'"
            )
            self._fail(session, trial)
            return
        else:
            self._record_failure(session, trial, cause or f"exit code {exit_code}")
            return
        trial.ended_at = utcnow()

    def _record_failure(self, session: Any, trial: Trial, fallback_reason: str) -> None:
        """Restart the trial, or fail it, and say why in one line.

        The reason is the exception the first failing rank recorded, else
        ``fallback_reason`` (an exit code, a hang). A run that failed the same way on
        every rank before its first step is a bug: it is failed without restarts.
        """
        verdict = self._run_verdict(session, trial)
        reason = verdict.reason if verdict is not None else fallback_reason
        label = f"trial {self._label(trial.optuna_trial_number)}"
        notify = functools.partial(self._notify_failure, trial, label)
        if verdict is not None and verdict.deterministic:
            trial.error = (
                f"{reason}; it failed this way before its first step, so it is not restarted"
            )
            notify()
            self._fail(session, trial)
            self._check_fail_fast(session)
        elif trial.restarts < self.config.max_restarts:
            trial.restarts += 1
            trial.state = TrialState.QUEUED
            trial.error = f"{reason}; restart {trial.restarts} of {self.config.max_restarts}"
            notify()
            self._queue(trial)
        else:
            trial.error = f"{reason}; failed after {trial.restarts} restarts"
            notify()
            self._fail(session, trial)
            self._check_fail_fast(session)

    @staticmethod
    def _notify_failure(trial: Trial, label: str) -> None:
        """One line on the driver's terminal and in the trial's log."""
        _log.warning("%s failed: %s", label, trial.error)
        if trial.log_path:
            with contextlib.suppress(OSError):
                write_log_line(Path(trial.log_path), f"{label} failed: {trial.error}")

    @staticmethod
    def _failures_of_latest_run(session: Any, trial_id: int) -> list[FailureRecord]:
        """What the ranks of the trial's latest run recorded, in the order they failed."""
        run_id = session.scalar(
            select(TrialRun.id)
            .where(TrialRun.trial_id == trial_id)
            .order_by(TrialRun.attempt.desc())
            .limit(1)
        )
        if run_id is None:
            return []
        rows = session.scalars(
            select(TrialFailure)
            .where(TrialFailure.run_id == run_id)
            .order_by(TrialFailure.recorded_at, TrialFailure.id)
        )
        return [
            FailureRecord(row.rank, row.exception_type, row.message, row.steps_completed)
            for row in rows
        ]

    def _run_verdict(self, session: Any, trial: Trial) -> RunVerdict | None:
        return judge_run(
            self._failures_of_latest_run(session, trial.id), world_size=trial.slots_per_trial
        )

    def _check_fail_fast(self, session: Any) -> None:
        """Stop the experiment (ERROR) when its first trials all failed the same way."""
        limit = self.config.fail_fast_trials
        if limit <= 0 or self._control.action is not None:
            return
        session.flush()
        outcomes = []
        for trial in session.scalars(
            select(Trial).where(Trial.experiment_id == self.experiment_id)
        ):
            succeeded: bool | None = None
            signature: tuple[str, str] | str | None = None
            if trial.state in (TrialState.COMPLETED, TrialState.PRUNED):
                succeeded = True
            elif trial.state == TrialState.ERROR:
                succeeded = False
                verdict = self._run_verdict(session, trial)
                signature = verdict.signature if verdict is not None else trial.error
            outcomes.append(TrialOutcome(trial.optuna_trial_number, succeeded, signature))
        reason = fail_fast_reason(outcomes, limit)
        if reason is not None:
            _log.warning("stopping the experiment: %s (fail_fast_trials: %d)", reason, limit)
            self._control.action = "error"
            self._stop_reason = reason

    def _completion_state(self) -> ExperimentState:
        """COMPLETED, or ERROR when trials ran and none of them succeeded."""
        with session_scope(self.db_url) as session:
            counts = trial_counts(session, self.experiment_id)
        if counts.total and not (counts.completed or counts.pruned):
            return ExperimentState.ERROR
        return ExperimentState.COMPLETED

    def _objective_values(self, trial: Trial) -> list[float]:
        assert trial.searcher_metric_value is not None
        values = [float(trial.searcher_metric_value)]
        for objective in self.config.searcher.objectives:
            if objective.name == "slot_seconds":
                values.append(float(trial.slot_seconds))
            else:
                wall = (utcnow() - trial.started_at).total_seconds() if trial.started_at else 0.0
                values.append(wall)
        return values

    def _fail(self, session: Any, trial: Trial) -> None:
        import optuna

        trial.state = TrialState.ERROR
        trial.ended_at = utcnow()
        self._tell(trial, state=optuna.trial.TrialState.FAIL)

    def _tell(
        self,
        trial: Trial,
        *,
        values: list[float] | None = None,
        state: optuna.trial.TrialState | None = None,
    ) -> None:
        """Queue the outcome for Optuna; :meth:`_flush_tells` sends it after our commit.

        Optuna uses its own connection: calling it inside one of our open SQLite
        transactions would wait on our own write lock.
        """
        self._tells.append((trial.optuna_trial_number, values, state))

    def _flush_tells(self) -> None:
        assert self._study is not None
        while self._tells:
            number, values, state = self._tells[0]
            # skip_if_finished: a tell that landed before a crash is not repeated.
            self._study.tell(number, values, state=state, skip_if_finished=True)
            self._tells.pop(0)

    # ----------------------------------------------------------------- control
    def _heartbeat(self) -> None:
        with session_scope(self.db_url) as session:
            experiment = session.get(Experiment, self.experiment_id)
            assert experiment is not None
            experiment.driver_heartbeat_at = utcnow()
            if experiment.requested_action in ("pause", "kill") and self._control.action != "kill":
                self._control.action = experiment.requested_action
            slot_ledger.renew_leases(session, self.experiment_id, LEASE_S)

    def _preempt_running(self) -> None:
        asking = [r for r in self._running.values() if r.preempted_at is None]
        if not asking:
            return
        with session_scope(self.db_url) as session:
            for running in asking:
                run = session.get(TrialRun, running.run_id)
                assert run is not None
                request_stop(session, run)
        now = time.monotonic()
        for running in asking:
            running.preempted_at = now

    def _kill_running(self) -> None:
        """End every running trial's processes; requeue them, or fail them on kill."""
        for running in self._running.values():
            running.job.end(grace_s=KILL_GRACE_S)
        with session_scope(self.db_url) as session:
            for running in self._running.values():
                run = session.get(TrialRun, running.run_id)
                trial = session.get(Trial, running.trial_id)
                assert run is not None and trial is not None
                run.reason = run.reason or "killed"
                if end_run(session, run):
                    slot_ledger.release(session, running.trial_id)
                if self._control.action == "kill":
                    trial.error = "killed by user"
                    self._fail(session, trial)
                elif self._control.action == "error":
                    trial.error = f"experiment stopped: {self._stop_reason}"
                    self._fail(session, trial)
                else:
                    trial.state = TrialState.QUEUED
        self._running.clear()
        self._flush_tells()

    def _finish(self, state: ExperimentState) -> None:
        with session_scope(self.db_url) as session:
            if state == ExperimentState.COMPLETED:
                collect_garbage(
                    session,
                    experiment_id=self.experiment_id,
                    policy=self.config.checkpoint_storage,
                    metric=self.config.searcher.metric,
                    smaller_is_better=self.config.searcher.smaller_is_better,
                )
            experiment = session.get(Experiment, self.experiment_id)
            assert experiment is not None
            if state in (ExperimentState.CANCELED, ExperimentState.ERROR):
                for trial in session.scalars(
                    select(Trial).where(
                        Trial.experiment_id == self.experiment_id,
                        Trial.state == TrialState.QUEUED,
                    )
                ):
                    trial.error = (
                        "experiment killed before the trial ran"
                        if state == ExperimentState.CANCELED
                        else f"experiment stopped before the trial ran: {self._stop_reason}"
                    )
                    self._fail(session, trial)
            experiment.state = state
            experiment.requested_action = None
            experiment.driver_heartbeat_at = None
            experiment.driver_pid = None
            if state.is_terminal:
                experiment.ended_at = utcnow()
        self._flush_tells()

    def _install_signal_handlers(self) -> None:
        def on_interrupt(signum: int, frame: FrameType | None) -> None:
            self._control.interrupts += 1
            if self._control.interrupts == 1:
                _log.warning(
                    "Ctrl-C: no new trials; running trials checkpoint and stop "
                    "(Ctrl-C again to stop now)"
                )
                self._control.action = "pause"
            else:
                raise KeyboardInterrupt

        with contextlib.suppress(ValueError):  # Not in the main thread: no handlers.
            self._control.handlers[signal.SIGINT] = signal.signal(signal.SIGINT, on_interrupt)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._control.handlers.items():
            with contextlib.suppress(ValueError):
                signal.signal(signum, handler)

    def _refresh_progress(self, progress: SearchProgress) -> None:
        with session_scope(self.db_url) as session:
            counts = trial_counts(session, self.experiment_id)
            best = session.execute(
                select(Trial.searcher_metric_value)
                .where(
                    Trial.experiment_id == self.experiment_id,
                    Trial.state == TrialState.COMPLETED,
                    Trial.searcher_metric_value.is_not(None),
                )
                .order_by(
                    Trial.searcher_metric_value.asc()
                    if self.config.searcher.smaller_is_better
                    else Trial.searcher_metric_value.desc()
                )
                .limit(1)
            ).scalar()
        progress.update(counts, best)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600, also when it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _last_validation_is_nan(session: Any, trial_id: int, metric: str) -> bool:
    """Whether ``metric``'s last validation was NaN (stored as NULL: training diverged)."""
    row = session.execute(
        select(Metric.value)
        .where(
            Metric.trial_id == trial_id,
            Metric.kind == MetricKind.VALIDATION,
            Metric.name == metric,
        )
        .order_by(Metric.step.desc())
        .limit(1)
    ).first()
    return row is not None and row[0] is None
