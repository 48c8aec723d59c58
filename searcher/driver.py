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
import logging
import os
import signal
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from searcher import samplers, space
from searcher.config import ExperimentConfig
from searcher.experiments import UsageError, driver_alive, trial_counts
from searcher.progress import SearchProgress
from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    TrialRun,
    TrialState,
    absolute_db_url,
    optuna_storage,
    session_scope,
    utcnow,
)
from trials import RuntimeSpec, per_slot_batch_size
from trials import allocations as slot_ledger
from trials._system_metrics import detect_gpus
from trials.launcher import (
    TrialProcesses,
    free_port,
    kill_leftover,
    start_trial,
    torchrun_commands,
)
from trials.retention import collect_garbage
from trials.scheduler import Cluster, Placement, SlotRequest, check_schedulable, schedule

if TYPE_CHECKING:
    import optuna

_log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 2.0
LEASE_S = 30.0
# A preempted trial gets this long to checkpoint and exit before it is killed.
PREEMPT_GRACE_S = 120.0


@dataclass
class _Running:
    trial_id: int
    optuna_number: int
    attempt: int
    slots: int
    processes: TrialProcesses
    started: float
    run_id: int
    preempt_path: Path
    preempted_at: float | None = None


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
    action: str | None = None  # "pause" or "kill"
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
        self._run_dir = self._logs_root() / f"experiment-{self.experiment_id}"
        # Slots are GPU indices exactly when this machine has GPUs (NVML finds them).
        self._use_gpus = bool(detect_gpus())
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
                if trial.state == TrialState.RUNNING:
                    self._end_leftover_run(session, trial)
        # Trials asked from Optuna whose row was never written (driver died in between)
        # are adopted rather than lost.
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

    def _end_leftover_run(self, session: Any, trial: Trial) -> None:
        run = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trial.id).order_by(TrialRun.attempt.desc())
        ).first()
        if run is not None:
            for node in run.agents or []:
                kill_leftover(int(node.get("pid", 0)), str(node.get("spec", "")))
            if run.ended_at is None:
                run.ended_at = utcnow()
                run.reason = "driver stopped; trial continues from its latest checkpoint"
        slot_ledger.release(session, trial.id)

    def _adopt(self, frozen: optuna.trial.FrozenTrial) -> None:
        hparams = dict(frozen.params)
        for name, hp in self.config.hyperparameters.items():
            if getattr(hp, "type", None) == "const":
                hparams.setdefault(name, hp.val)  # type: ignore[union-attr]
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

    def _queue(self, trial: Trial) -> None:
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
        final = ExperimentState.ACTIVE
        last_heartbeat = 0.0
        try:
            with progress:
                while True:
                    now = time.monotonic()
                    if now - last_heartbeat >= HEARTBEAT_EVERY_S:
                        self._heartbeat()
                        last_heartbeat = now
                    self._reap()
                    self._flush_tells()
                    if self._control.action == "kill":
                        self._kill_running()
                        final = ExperimentState.CANCELED
                        break
                    if self._control.action == "pause":
                        self._preempt_running()
                        if not self._running:
                            final = ExperimentState.PAUSED
                            break
                    else:
                        self._fill_queue()
                        self._place()
                        self._flush_tells()
                        if not self._running and not self._pending and self._search_done():
                            final = ExperimentState.COMPLETED
                            break
                    self._refresh_progress(progress)
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
            hparams = space.suggest_hparams(optuna_trial, self.config.hyperparameters)
            with session_scope(self.db_url) as session:
                trial = self._new_trial_row(optuna_trial.number, optuna_trial._trial_id, hparams)
                session.add(trial)
                session.flush()
                self._queue(trial)

    def _place(self) -> None:
        if not self._pending:
            return
        with session_scope(self.db_url) as session:
            slot_ledger.reclaim_stale(session, utcnow())
            free = slot_ledger.free_slots(session, self.pool, utcnow())
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
                with session_scope(self.db_url) as session:
                    slot_ledger.release(session, pending.trial_id)
                    trial = session.get(Trial, pending.trial_id)
                    assert trial is not None
                    trial.error = f"launch failed: {exc}"
                    self._fail(session, trial)

    def _launch(self, trial_id: int, placement: Placement) -> None:
        with session_scope(self.db_url) as session:
            trial = session.get(Trial, trial_id)
            assert trial is not None
            attempt = len(trial.runs)
            checkpoint = self._latest_checkpoint(session, trial_id)
            spec_path = self._run_dir / f"trial-{trial_id}.attempt-{attempt}.spec.json"
            preempt_path = self._run_dir / f"trial-{trial_id}.preempt"
            log_path = Path(trial.log_path or self._run_dir / f"trial-{trial_id}.log")
            spec = self._runtime_spec(trial, attempt, checkpoint, preempt_path)
            self._run_dir.mkdir(parents=True, exist_ok=True)
            spec_path.write_text(spec.model_dump_json(indent=2))
            with contextlib.suppress(FileNotFoundError):
                preempt_path.unlink()
            _, dropped = per_slot_batch_size(
                int(trial.hparams["global_batch_size"]), trial.slots_per_trial
            )
            if dropped and attempt == 0:
                warnings.warn(
                    f"trial {trial_id}: global_batch_size {trial.hparams['global_batch_size']} "
                    f"is not divisible by slots_per_trial {trial.slots_per_trial}; "
                    f"{dropped} samples per batch are dropped",
                    stacklevel=1,
                )
            rdzv_port = (
                free_port(placement.agents[0].agent.host) if len(placement.agents) > 1 else None
            )
            commands = torchrun_commands(
                placement,
                spec_path=str(spec_path),
                rdzv_id=f"slotsweep-{trial_id}-{attempt}",
                rdzv_port=rdzv_port,
                use_gpus=self._use_gpus,
            )
            processes = start_trial(commands, log_path=log_path, cwd=self.model_dir)
            nodes = processes.describe()
            for node in nodes:
                node["spec"] = str(spec_path)
            run = TrialRun(
                trial_id=trial_id,
                attempt=attempt,
                agents=nodes,
                restored_from_checkpoint=checkpoint.uuid if checkpoint else None,
                restored_from_step=checkpoint.step if checkpoint else None,
                reason=None if attempt == 0 else "continued",
            )
            session.add(run)
            trial.state = TrialState.RUNNING
            trial.log_path = str(log_path)
            trial.started_at = trial.started_at or utcnow()
            session.flush()
            self._running[trial_id] = _Running(
                trial_id=trial_id,
                optuna_number=trial.optuna_trial_number,
                attempt=attempt,
                slots=trial.slots_per_trial,
                processes=processes,
                started=time.monotonic(),
                run_id=run.id,
                preempt_path=preempt_path,
            )

    def _runtime_spec(
        self, trial: Trial, attempt: int, checkpoint: Checkpoint | None, preempt_path: Path
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
            preempt_path=str(preempt_path),
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
            exit_code = running.processes.poll()
            if exit_code is None:
                if (
                    running.preempted_at is not None
                    and time.monotonic() - running.preempted_at > PREEMPT_GRACE_S
                ):
                    running.processes.terminate(signal.SIGKILL)
                continue
            del self._running[trial_id]
            elapsed = time.monotonic() - running.started
            with session_scope(self.db_url) as session:
                trial = session.get(Trial, trial_id)
                run = session.get(TrialRun, running.run_id)
                assert trial is not None and run is not None
                trial.slot_seconds = (trial.slot_seconds or 0.0) + elapsed * running.slots
                run.ended_at = utcnow()
                run.exit_code = exit_code
                trial.exit_code = exit_code
                slot_ledger.release(session, trial_id)
                if running.preempted_at is not None and not (trial.finished_at or trial.pruned_at):
                    run.reason = "paused"
                    trial.state = TrialState.QUEUED
                    continue
                self._finalize_outcome(session, trial, exit_code=exit_code)

    def _finalize_outcome(self, session: Any, trial: Trial, exit_code: int | None) -> None:
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
        elif trial.restarts < self.config.max_restarts:
            trial.restarts += 1
            trial.state = TrialState.QUEUED
            trial.error = (
                f"exit code {exit_code}; restart {trial.restarts} of {self.config.max_restarts}"
            )
            self._queue(trial)
            return
        else:
            trial.error = trial.error or f"exit code {exit_code} after {trial.restarts} restarts"
            self._fail(session, trial)
            return
        trial.ended_at = utcnow()

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
            number, values, state = self._tells.pop(0)
            # skip_if_finished: a tell that landed before a crash is not repeated.
            self._study.tell(number, values, state=state, skip_if_finished=True)

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
        for running in self._running.values():
            if running.preempted_at is None:
                running.preempted_at = time.monotonic()
                running.preempt_path.parent.mkdir(parents=True, exist_ok=True)
                running.preempt_path.touch()

    def _kill_running(self) -> None:
        for running in self._running.values():
            running.processes.terminate(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for running in self._running.values():
            running.processes.wait(timeout=max(0.1, deadline - time.monotonic()))
            running.processes.terminate(signal.SIGKILL)
        with session_scope(self.db_url) as session:
            for running in self._running.values():
                run = session.get(TrialRun, running.run_id)
                trial = session.get(Trial, running.trial_id)
                assert run is not None and trial is not None
                run.ended_at = utcnow()
                run.reason = "killed"
                slot_ledger.release(session, running.trial_id)
                if self._control.action == "kill":
                    trial.error = "killed by user"
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
            if state == ExperimentState.CANCELED:
                for trial in session.scalars(
                    select(Trial).where(
                        Trial.experiment_id == self.experiment_id,
                        Trial.state == TrialState.QUEUED,
                    )
                ):
                    trial.error = "experiment killed before the trial ran"
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
