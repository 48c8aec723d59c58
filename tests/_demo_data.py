"""Databases to test and benchmark the UI against: a small real search, a huge one, a queue.

Test and benchmark fixtures, not part of the shipped packages. What they write comes
from the code that writes it in a real search, so it cannot drift from it:

- experiments: :func:`searcher.submit.creation.create_experiment` with a config validated
  by :func:`trials.config.parse_config`; samplers and pruners from
  :mod:`searcher.submit.samplers`, hyperparameters from :func:`searcher.submit.space.suggest_hparams`;
- everything rank 0 records: the runtime's own :class:`trials.runtime.TrialContext`
  with a :class:`trials.runtime._recorder.ChiefRecorder`, as ``run_trial`` builds them
  for a core-API trial. Metrics, profiling windows (``trials.runtime._timing``),
  checkpoints (files, rows and retention), the trial's progress and outcome, Optuna's
  intermediate values and pruning all take the runtime's path, in fenced transactions;
- system metrics: :func:`trials._system_metrics.host_metrics` and
  :func:`~trials._system_metrics.system_metric_rows`, fenced as the sampler fences them;
- a rank's exception: :func:`trials.runtime._failure.record_failure`;
- runs: ended by :func:`trials.coordination.attempts.end_run`; slots held by
  :func:`trials.coordination.allocations.claim`.

Only the driver's own bookkeeping (a trial's row, a run's row, a trial's final state)
is written here the way ``searcher/driver/driver.py`` writes it, since that code lives in the
live driver's methods.

:func:`seed_small_search` runs a genuine, tiny search in-process: Optuna's TPE sampler
and median pruner, a linear model trained on synthetic regression data with each batch
split across two simulated ranks (their losses averaged, as DDP averages gradients). It
records every outcome the UI must show: completed, pruned, failed after restarts,
restarted from a checkpoint, still running with slots held, a checkpoint deleted by
retention and one missing from disk, plus a multi-objective (cost-aware) experiment.
The UI's slow tests look at a real ``slotsweep run`` instead (``tests/real_search.py``);
this seed stands in for the states such a small run cannot produce reliably and keeps
the quick tests fast.

:func:`seed_huge_experiment` bulk-inserts an experiment of 1,000 trials and 200,000
metric rows (or more) for the render benchmark and the huge-state test. Its rows come
from the runtime's row builders: :func:`storage.metric_rows`,
:func:`trials.runtime._recorder.timing_rows` and
:func:`~trials.runtime._recorder.checkpoint_row`,
:func:`trials._system_metrics.system_metric_rows`.

:func:`seed_cluster_queue` puts searches sharing a small pool in the cluster's queue as
their drivers do (``searcher/driver/placement.py``: queue rows, launches, a pause) and lets
the real placement decision, :func:`trials.coordination.cluster_queue.decide`, place them or hold
them back: each waiting trial's reason is the scheduler's own.

Example (from the repository's root)::

    python -m tests._demo_data sqlite:////tmp/demo.db /tmp/demo [--huge]
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import math
import os
import random
import shutil
import socket
import time
import uuid as _uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select

from storage import (
    Allocation,
    Checkpoint,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    QueuedTrial,
    SystemMetric,
    Timing,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    claim_attempt,
    get_engine,
    metric_rows,
    optuna_storage,
    optuna_trial_id,
    session_scope,
    utcnow,
)
from trials.labels import trial_log_name

if TYPE_CHECKING:
    import optuna
    import torch

    from trials import RuntimeSpec
    from trials._system_metrics import HostCounters
    from trials.config import ExperimentConfig
    from trials.runtime import TrialContext
    from trials.runtime._recorder import ChiefRecorder
    from trials.runtime._timing import PhaseProfiler, TimingWindow
    from trials.scheduler import Placement

SLOTS_PER_TRIAL = 2
AGENT = "agent-0"
HOST = "127.0.0.1"
POOL = "default"
# The slots of AGENT in the cluster file; the running trial holds the first two.
AGENT_SLOTS = (0, 1, 2, 3)


@dataclasses.dataclass(frozen=True)
class DemoSearch:
    """Ids of the rows a test or a look at the UI wants to find again."""

    url: str
    experiment_id: int
    study_name: str
    multi_objective_experiment_id: int
    completed_trial_id: int
    pruned_trial_id: int
    failed_trial_id: int
    restarted_trial_id: int
    running_trial_id: int
    missing_checkpoint_trial_id: int
    missing_checkpoint_path: str
    downloadable_checkpoint_path: str


# --- Experiments ------------------------------------------------------------------------


def experiment_config(
    name: str,
    *,
    max_trials: int,
    checkpoint_dir: Path,
    objectives: tuple[str, ...] = (),
    epochs: int = 3,
    seed: int = 0,
    pruner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An experiment config as a user writes it (validated by ``trials.config``).

    The pruner is ``pruner``, else the median rule (none with ``objectives``).

    Retention keeps each trial's 2 newest checkpoints and no "best" one, so a trial
    that checkpointed 3 times always has its oldest deleted.
    """
    return {
        "name": name,
        "entrypoint": "model:RegressionTrial",
        "hyperparameters": {
            "global_batch_size": {"type": "categorical", "vals": [8, 16]},
            "lr": {"type": "log", "minval": 1e-4, "maxval": 0.3},
            "optimizer": {"type": "categorical", "vals": ["sgd", "adamw"]},
            "warmup_epochs": {"type": "int", "minval": 0, "maxval": 1},
        },
        "searcher": {
            "name": "nsga2" if objectives else "tpe",
            "metric": "val_loss",
            "smaller_is_better": True,
            "max_trials": max_trials,
            "max_length": {"epochs": epochs},
            "max_concurrent_trials": 2,
            "seed": seed,
            "n_startup_trials": 4,
            "pruner": pruner
            or ({"name": "none"} if objectives else {"name": "median", "n_startup_trials": 2}),
            "objectives": list(objectives),
        },
        "resources": {"slots_per_trial": SLOTS_PER_TRIAL, "resource_pool": POOL},
        "checkpoint_storage": {
            "path": str(checkpoint_dir),
            "save_trial_latest": 2,
            "save_trial_best": 0,
        },
        "profiling": {"window_batches": 4},
        "max_restarts": 1,
    }


@dataclasses.dataclass(frozen=True)
class _Experiment:
    """An experiment as the driver holds it: its row's id, its study, its config."""

    url: str
    experiment_id: int
    study_name: str
    config: ExperimentConfig
    model_dir: Path
    #: Its folder under ``checkpoint_storage.path`` (the row's ``checkpoint_folder``).
    checkpoint_folder: str


def _create_experiment(url: str, raw_config: dict[str, Any], model_dir: Path) -> _Experiment:
    """``slotsweep run``'s experiment: the config validated and stored, the study created.

    The experiment is left ACTIVE with this process as its live driver (a fresh
    heartbeat), as the driver claims it when it starts.
    """
    from searcher.submit.creation import create_experiment
    from searcher.submit.samplers import study_directions
    from trials.config import parse_config

    config = parse_config(raw_config)
    experiment_id = create_experiment(
        config,
        config_path=model_dir / f"{config.name}.yaml",
        db_url=url,
        directions=study_directions(config),
    )
    with session_scope(url) as session:
        experiment = session.get_one(Experiment, experiment_id)
        experiment.driver_host = socket.gethostname()
        experiment.driver_pid = os.getpid()
        experiment.driver_heartbeat_at = utcnow()
        study_name = experiment.study_name
        checkpoint_folder = experiment.checkpoint_folder
    return _Experiment(url, experiment_id, study_name, config, model_dir, checkpoint_folder)


def _load_study(experiment: _Experiment) -> optuna.Study:
    """The experiment's study with the driver's sampler and pruner."""
    import optuna

    from searcher.submit.samplers import build_pruner, build_sampler

    return optuna.load_study(
        study_name=experiment.study_name,
        storage=optuna_storage(experiment.url),
        sampler=build_sampler(experiment.config),
        pruner=build_pruner(experiment.config),
    )


def _complete_experiment(url: str, experiment_id: int) -> None:
    with session_scope(url) as session:
        done = session.get_one(Experiment, experiment_id)
        done.state = ExperimentState.COMPLETED
        done.ended_at = utcnow()


# --- The driver's bookkeeping (as searcher/driver/driver.py writes it) -------------------------


@dataclasses.dataclass(frozen=True)
class _TrialRow:
    """A trial as the driver launches it."""

    trial_id: int
    optuna_trial_id: int
    number: int
    hparams: dict[str, Any]
    log_path: Path


def _new_trial(
    experiment: _Experiment, trial: optuna.Trial, hparams: dict[str, Any], log_dir: Path
) -> _TrialRow:
    """The trial's row as the driver has it once launched: RUNNING, with its log path."""
    log_path = log_dir / trial_log_name(trial.number)
    with session_scope(experiment.url) as session:
        row = Trial(
            experiment_id=experiment.experiment_id,
            optuna_trial_id=optuna_trial_id(experiment.url, experiment.study_name, trial.number),
            optuna_trial_number=trial.number,
            state=TrialState.RUNNING,
            hparams=hparams,
            slots_per_trial=SLOTS_PER_TRIAL,
            log_path=str(log_path),
            started_at=utcnow(),
        )
        session.add(row)
        session.flush()
        trial_id = row.id
    return _TrialRow(
        trial_id,
        optuna_trial_id(experiment.url, experiment.study_name, trial.number),
        trial.number,
        hparams,
        log_path,
    )


def _node(slots: Sequence[int], agent: str = AGENT) -> dict[str, Any]:
    # One node of a launch as the driver records it in ``TrialRun.agents``.
    return {"agent": agent, "host": HOST, "slots": list(slots)}


def _launch(url: str, trial_id: int, attempt: int, restore: Checkpoint | None) -> int:
    """The run row of ``attempt``, restoring from ``restore`` (the trial's latest checkpoint)."""
    with session_scope(url) as session:
        run = TrialRun(
            trial_id=trial_id,
            attempt=attempt,
            agents=[_node(range(SLOTS_PER_TRIAL))],
            restored_from_checkpoint=restore.uuid if restore else None,
            restored_from_step=restore.step if restore else None,
        )
        session.add(run)
        session.flush()
        return run.id


def _end_run(url: str, run_id: int, exit_code: int, reason: str | None = None) -> None:
    """``torchrun`` exited with ``exit_code``: the run is ended (no process of it is left)."""
    from trials.coordination.attempts import end_run

    with session_scope(url) as session:
        run = session.get_one(TrialRun, run_id)
        run.exit_code = exit_code
        if not end_run(session, run, reason=reason):
            raise RuntimeError(f"run {run_id} still has processes")


def _latest_checkpoint(url: str, trial_id: int) -> Checkpoint | None:
    """The checkpoint a restart continues from (the trial's newest), detached."""
    with session_scope(url) as session:
        latest = (
            session.query(Checkpoint)
            .filter_by(trial_id=trial_id)
            .order_by(Checkpoint.step.desc())
            .first()
        )
        if latest is not None:
            session.expunge(latest)
        return latest


def _finish_trial(
    url: str,
    trial_id: int,
    state: TrialState,
    *,
    restarts: int = 0,
    exit_code: int | None = 0,
    error: str | None = None,
) -> float:
    """The driver's final word on a trial; returns its slot-seconds.

    Rank 0 has already recorded the searcher metric, the batches trained and
    ``finished_at`` or ``pruned_at``.
    """
    with session_scope(url) as session:
        row = session.get_one(Trial, trial_id)
        row.state = state
        row.restarts = restarts
        row.ended_at = utcnow()
        row.exit_code = exit_code
        row.error = error
        started = row.started_at or row.ended_at
        row.slot_seconds = (row.ended_at - started).total_seconds() * SLOTS_PER_TRIAL
        return row.slot_seconds


def _hold_slots(url: str, experiment_id: int, trial_id: int) -> None:
    """The trial's slots claimed in the ledger, as the scheduler claims them at launch."""
    from trials.coordination.allocations import claim
    from trials.scheduler import Agent, AgentSlots, Placement

    agent = Agent(AGENT, HOST, AGENT_SLOTS)
    placement = Placement(
        request_id=trial_id,
        pool=POOL,
        agents=(AgentSlots(agent, tuple(range(SLOTS_PER_TRIAL))),),
    )
    with session_scope(url) as session:
        if not claim(
            session, placement, trial_id=trial_id, experiment_id=experiment_id, lease_s=300.0
        ):
            raise RuntimeError(f"the slots of trial {trial_id} are held already")


# --- Rank 0 (the runtime's own objects) -------------------------------------------------


@dataclasses.dataclass
class _Data:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def _make_data(seed: int) -> _Data:
    import torch

    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(8, 1, generator=generator)
    x = torch.randn(96, 8, generator=generator)
    y = x @ weights + 0.1 * torch.randn(96, 1, generator=generator)
    return _Data(x[:64], y[:64], x[64:], y[64:])


class _RankKilled(Exception):
    """Rank 1 killed by its host (SIGKILL): it records nothing; ``torchrun`` exits -9."""


class SimulatedRankFailure(RuntimeError):
    """Rank 1's code raised: it records why (``record_failure``); ``torchrun`` exits 1."""


@dataclasses.dataclass(frozen=True)
class _Fault:
    """How an attempt ends early, if it does.

    Attributes:
        kill_after_epoch: Rank 1 is killed once this epoch's checkpoint is written.
        raise_at_step: Rank 1 raises when this step (batches trained) is reached.
    """

    kill_after_epoch: int | None = None
    raise_at_step: int | None = None


def _runtime_spec(
    experiment: _Experiment, trial: _TrialRow, attempt: int, restore: Checkpoint | None
) -> RuntimeSpec:
    """The spec the driver builds for one attempt, through the driver's own builder."""
    from searcher.driver.runtime_spec import runtime_spec_of

    return runtime_spec_of(
        experiment.config,
        db_url=experiment.url,
        experiment_id=experiment.experiment_id,
        checkpoint_folder=experiment.checkpoint_folder,
        study_name=experiment.study_name,
        model_dir=experiment.model_dir,
        trial_id=trial.trial_id,
        optuna_trial_id=trial.optuna_trial_id,
        optuna_trial_number=trial.number,
        hparams=trial.hparams,
        slots_per_trial=SLOTS_PER_TRIAL,
        attempt=attempt,
        checkpoint_path=restore.path if restore else None,
        agent=AGENT,
        run_dir=experiment.model_dir / "logs" / f"experiment-{experiment.experiment_id}",
    )


@dataclasses.dataclass
class _Training:
    """What one attempt trains: the model, its optimizer and schedule, the epoch's size."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batches_per_epoch: int


class _RankZero:
    """One attempt of a trial as its rank 0 runs it, recording through the runtime.

    ``TrialContext`` and ``ChiefRecorder`` are what ``trials.runtime._runner.run_trial``
    gives a core-API trial (one process here, so every collective is a no-op). The two
    ranks of the trial are simulated inside it: each batch is split in halves whose
    losses are averaged, and each rank's lines go to the trial's log.
    """

    def __init__(self, spec: RuntimeSpec, data: _Data, log_path: Path) -> None:

        from trials.runtime import CpuAccelerator, TrialContext
        from trials.runtime._distributed import DistributedInfo
        from trials.runtime._recorder import ChiefRecorder

        self.spec = spec
        self.data = data
        self.log_path = log_path
        self.recorder: ChiefRecorder = ChiefRecorder(spec)
        self.context: TrialContext = TrialContext(
            spec, DistributedInfo(), CpuAccelerator(), self.recorder
        )

    def __enter__(self) -> _RankZero:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.recorder.close()  # Commits whatever is queued.

    def log(self, rank: int | None, message: str) -> None:
        """A line of the trial's log, prefixed by its rank as the worker prefixes it."""
        prefix = f"[rank {rank}] " if rank is not None else ""
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{prefix}{message}\n")

    def train(self, fault: _Fault | None = None) -> bool:
        """Train to ``max_length`` (or until pruned, or ``fault``); whether it was pruned.

        Raises :class:`_RankKilled` or :class:`SimulatedRankFailure` as ``fault`` says.
        """
        from trials.runtime._timing import PhaseProfiler, WindowedTimings

        fault = fault or _Fault()
        training = self._build()
        step = self._restore(training)
        profiler = PhaseProfiler(
            WindowedTimings(self.spec.profiling.window_batches, start_step=step)
        )
        counters = _prime_system_metrics()
        for epoch in range(step // training.batches_per_epoch, self.spec.max_length.value):
            step = self._train_epoch(training, profiler, epoch, step, fault)
            val_loss = self._validate(training, step)
            counters = _record_system_sample(self.spec, counters)
            self._checkpoint(training, step)
            if fault.kill_after_epoch == epoch:
                self.log(1, "killed by the host (SIGKILL)")
                raise _RankKilled(f"rank 1 was killed after epoch {epoch}")
            if self.context.should_prune():
                self.log(0, f"pruned by the median pruner after epoch {epoch}: {val_loss:.4f}")
                self._profile(profiler.flush(step))
                return True
        self._profile(profiler.flush(step))
        self.recorder.finished(self.context.steps_reported)
        return False

    def _build(self) -> _Training:
        """The model, optimizer and warm-up schedule the trial's hyperparameters ask for."""
        import torch

        torch.manual_seed(1234)
        model = torch.nn.Linear(8, 1)
        hparams = self.spec.hparams
        lr = float(hparams["lr"])
        optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            if hparams["optimizer"] == "sgd"
            else torch.optim.AdamW(model.parameters(), lr=lr)
        )
        batches_per_epoch = len(self.data.x_train) // self.context.global_batch_size
        warmup_steps = int(hparams["warmup_epochs"]) * batches_per_epoch
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0
        )
        return _Training(model, optimizer, scheduler, batches_per_epoch)

    def _restore(self, training: _Training) -> int:
        """Load the checkpoint the driver named, if any; the step it continues from."""
        restored = self.context.load_latest_checkpoint()
        if restored is None:
            return 0
        training.model.load_state_dict(restored.state["model"])
        training.optimizer.load_state_dict(restored.state["optimizer"])
        training.scheduler.load_state_dict(restored.state["lr_scheduler"])
        for rank in range(SLOTS_PER_TRIAL):
            self.log(rank, f"restored checkpoint at step {restored.steps_completed}")
        return restored.steps_completed

    def _train_epoch(
        self, training: _Training, profiler: PhaseProfiler, epoch: int, step: int, fault: _Fault
    ) -> int:
        """One epoch of batches, each recorded and profiled; the step reached."""
        import torch

        order = torch.randperm(
            len(self.data.x_train), generator=torch.Generator().manual_seed(epoch)
        )
        for batch in range(training.batches_per_epoch):
            step += 1
            losses = self._train_batch(training, profiler, order[self._rows(batch)], step)
            for rank, value in enumerate(losses):
                self.log(rank, f"epoch {epoch} batch {batch} step {step} loss {value:.4f}")
            self._profile(profiler.end_batch(step))
            if fault.raise_at_step == step:
                failure = SimulatedRankFailure(f"rank 1 failed at step {step} (simulated)")
                self.log(1, f"{type(failure).__name__}: {failure}")
                raise failure
        return step

    def _rows(self, batch: int) -> slice:
        size = self.context.global_batch_size
        return slice(batch * size, (batch + 1) * size)

    def _train_batch(
        self, training: _Training, profiler: PhaseProfiler, index: torch.Tensor, step: int
    ) -> list[float]:
        """One batch of both simulated ranks, timed in the managed loop's phases; their losses.

        Its metrics are recorded as the managed loop records a report: averaged across
        the ranks, with the epoch reached.
        """
        import statistics

        import torch

        per_rank = self.context.global_batch_size // SLOTS_PER_TRIAL
        profiler.begin_batch()
        x, y = self.data.x_train[index], self.data.y_train[index]
        profiler.lap("dataloader_next")
        x, y = x.contiguous(), y.contiguous()
        profiler.lap("to_device")
        training.optimizer.zero_grad()
        losses = []
        for rank in range(SLOTS_PER_TRIAL):
            part = slice(rank * per_rank, (rank + 1) * per_rank)
            loss = torch.nn.functional.mse_loss(training.model(x[part]), y[part])
            (loss / SLOTS_PER_TRIAL).backward()  # Averaged gradients, as DDP's.
            losses.append(float(loss.detach()))
        training.optimizer.step()
        profiler.lap("train_batch")
        training.scheduler.step()
        profiler.lap("step_lr_schedulers")
        means = {
            "loss": statistics.fmean(losses),
            "lr": float(training.scheduler.get_last_lr()[0]),
        }
        profiler.lap("reduce_metrics")
        profiler.lap("from_device")
        self.recorder.training_metrics(step, step / training.batches_per_epoch, means)
        self.context.steps_reported = max(self.context.steps_reported, step)
        return losses

    def _profile(self, windows: Sequence[TimingWindow]) -> None:
        if windows:
            self.recorder.timings(windows)

    def _validate(self, training: _Training, step: int) -> float:
        """Validation metrics recorded (and reported to the pruner) by the context."""
        import torch

        with torch.no_grad():
            prediction = training.model(self.data.x_val)
            val_loss = float(torch.nn.functional.mse_loss(prediction, self.data.y_val))
        self.context.report_validation_metrics(
            step, {"val_loss": val_loss}, epoch=step / training.batches_per_epoch
        )
        for rank in range(SLOTS_PER_TRIAL):
            self.log(rank, f"validation at step {step}: val_loss {val_loss:.4f}")
        return val_loss

    def _checkpoint(self, training: _Training, step: int) -> None:
        """A checkpoint through the context: file, row, then retention, as the runtime does."""
        self.context.save_checkpoint(
            {
                "model": training.model.state_dict(),
                "optimizer": training.optimizer.state_dict(),
                "lr_scheduler": training.scheduler.state_dict(),
            },
            step,
            epoch=step / training.batches_per_epoch,
        )


def _prime_system_metrics() -> HostCounters:
    """Start a sampling window, as the sampler's thread does when it starts."""
    import psutil

    from trials._system_metrics import read_host_counters

    psutil.cpu_percent(interval=None)
    return read_host_counters()


def _record_system_sample(spec: RuntimeSpec, before: HostCounters) -> HostCounters:
    """One sample of the agent's host metrics, written as the sampler writes it."""
    from trials._system_metrics import host_metrics, read_host_counters, system_metric_rows

    after = read_host_counters()
    values = [(None, name, value) for name, value in host_metrics(before, after).items()]
    with session_scope(spec.db_url) as session:
        claim_attempt(session, spec.trial_id, spec.attempt, progress=False)
        session.add_all(
            SystemMetric(**row)
            for row in system_metric_rows(spec.trial_id, spec.agent, utcnow(), values)
        )
    return after


# --- The small search -------------------------------------------------------------------

# The first trials are enqueued so that each outcome the UI must show happens for sure.
_ENQUEUED: tuple[tuple[str, dict[str, Any]], ...] = (
    ("completed", {"global_batch_size": 8, "lr": 0.05, "optimizer": "sgd", "warmup_epochs": 0}),
    ("missing", {"global_batch_size": 16, "lr": 0.1, "optimizer": "adamw", "warmup_epochs": 1}),
    ("pruned", {"global_batch_size": 16, "lr": 1.2e-4, "optimizer": "sgd", "warmup_epochs": 1}),
    ("restarted", {"global_batch_size": 16, "lr": 0.2, "optimizer": "adamw", "warmup_epochs": 0}),
    ("failed", {"global_batch_size": 16, "lr": 0.01, "optimizer": "sgd", "warmup_epochs": 0}),
)
_SAMPLED_TRIALS = 2


@dataclasses.dataclass
class _Outcomes:
    """What the small search's trials turned out to be (trial ids by role, paths)."""

    ids: dict[str, int] = dataclasses.field(default_factory=dict)
    missing_path: str = ""
    downloadable_path: str = ""


class _SearchRun:
    """The driver's side of the small search: ask, launch, restart, finish, tell."""

    def __init__(self, experiment: _Experiment, data: _Data, log_dir: Path) -> None:
        self.experiment = experiment
        self.url = experiment.url
        self.study = _load_study(experiment)
        self.data = data
        self.log_dir = log_dir

    def ask(self) -> tuple[optuna.Trial, _TrialRow]:
        """The next trial, asked of Optuna and launched as the driver launches it."""
        from searcher.submit.space import suggest_hparams

        trial = self.study.ask()
        hparams = suggest_hparams(trial, self.experiment.config.hyperparameters)
        row = _new_trial(self.experiment, trial, hparams, self.log_dir)
        with open(row.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"torchrun: launching {SLOTS_PER_TRIAL} ranks on {AGENT}\n")
        return trial, row

    def attempt(
        self, row: _TrialRow, attempt: int, fault: _Fault | None = None
    ) -> tuple[int, bool]:
        """Run ``attempt`` of the trial from its latest checkpoint; (run id, pruned).

        The fault's exception propagates once rank 0 has stopped and a raising rank has
        recorded its failure; the run is still open.
        """
        from trials.runtime._failure import record_failure

        restore = _latest_checkpoint(self.url, row.trial_id) if attempt else None
        run_id = _launch(self.url, row.trial_id, attempt, restore)
        spec = _runtime_spec(self.experiment, row, attempt, restore)
        rank_zero = _RankZero(spec, self.data, row.log_path)
        try:
            with rank_zero:
                pruned = rank_zero.train(fault)
        except SimulatedRankFailure as error:
            record_failure(spec, 1, error, rank_zero.context.steps_reported)
            raise
        return run_id, pruned

    def finish(self, trial: optuna.Trial, row: _TrialRow, pruned: bool, restarts: int) -> str:
        """Mark the trial PRUNED or COMPLETED and tell Optuna (the driver's outcome)."""
        import optuna

        state = TrialState.PRUNED if pruned else TrialState.COMPLETED
        slot_seconds = _finish_trial(self.url, row.trial_id, state, restarts=restarts)
        if pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return "pruned"
        value = _searcher_metric(self.url, row.trial_id)
        values = [value, slot_seconds] if len(self.study.directions) > 1 else [value]
        self.study.tell(trial, values)
        return "completed"


def _searcher_metric(url: str, trial_id: int) -> float:
    with session_scope(url) as session:
        value = session.get_one(Trial, trial_id).searcher_metric_value
    if value is None:
        raise RuntimeError(f"trial {trial_id} finished without its searcher metric")
    return float(value)


def _run_normal(search: _SearchRun, role: str, outcomes: _Outcomes) -> None:
    """A trial that trains to its end or is pruned, in one attempt."""
    trial, row = search.ask()
    run_id, pruned = search.attempt(row, 0)
    _end_run(search.url, run_id, 0)
    outcome = search.finish(trial, row, pruned, restarts=0)
    outcomes.ids.setdefault(outcome, row.trial_id)
    newest = _latest_checkpoint(search.url, row.trial_id)
    if newest is None:
        return
    if role == "completed":
        outcomes.downloadable_path = newest.path
    if role == "missing":
        # Someone removed the newest checkpoint by hand: the UI must say so.
        shutil.rmtree(newest.path)
        outcomes.missing_path = newest.path
        outcomes.ids["missing"] = row.trial_id


def _run_restarted(search: _SearchRun, outcomes: _Outcomes) -> None:
    """Rank 1 is killed after the first epoch; the restart continues from its checkpoint."""
    trial, row = search.ask()
    try:
        search.attempt(row, 0, _Fault(kill_after_epoch=0))
        raise RuntimeError("the restarted trial's first attempt did not fail")
    except _RankKilled as killed:
        run_id = _latest_run(search.url, row.trial_id)
        _end_run(search.url, run_id, -9, f"{killed}; restarting from the latest checkpoint")
    run_id, pruned = search.attempt(row, 1)
    _end_run(search.url, run_id, 0)
    search.finish(trial, row, pruned, restarts=1)
    outcomes.ids["restarted"] = row.trial_id


def _run_failed(search: _SearchRun, outcomes: _Outcomes) -> None:
    """Rank 1 raises early in every attempt; after ``max_restarts`` (1) the trial fails."""
    import optuna

    trial, row = search.ask()
    for attempt in range(2):
        try:
            search.attempt(row, attempt, _Fault(raise_at_step=3))
            raise RuntimeError("the failed trial's attempt did not fail")
        except SimulatedRankFailure as error:
            _end_run(search.url, _latest_run(search.url, row.trial_id), 1, str(error))
    search.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    _finish_trial(
        search.url,
        row.trial_id,
        TrialState.ERROR,
        restarts=1,
        exit_code=1,
        error="rank 1 failed at step 3 on every attempt; max_restarts (1) exhausted",
    )
    outcomes.ids["failed"] = row.trial_id


def _latest_run(url: str, trial_id: int) -> int:
    with session_scope(url) as session:
        return int(
            session.query(TrialRun.id)
            .filter_by(trial_id=trial_id)
            .order_by(TrialRun.attempt.desc())
            .limit(1)
            .scalar()
        )


def _start_running_trial(search: _SearchRun) -> int:
    """A trial that has just started: slots held, its run open, nothing recorded yet."""
    _trial, row = search.ask()
    _launch(search.url, row.trial_id, 0, None)
    _hold_slots(search.url, search.experiment.experiment_id, row.trial_id)
    return row.trial_id


def _single_objective_search(url: str, root: Path, data: _Data, seed: int) -> DemoSearch:
    """``regression-demo``: TPE and the median pruner, every outcome, one trial running."""
    raw = experiment_config(
        "regression-demo", max_trials=8, checkpoint_dir=root / "checkpoints", seed=seed
    )
    experiment = _create_experiment(url, raw, root)
    search = _SearchRun(experiment, data, root / "logs")
    for _, params in _ENQUEUED:
        search.study.enqueue_trial(params)
    outcomes = _Outcomes()
    for role, _ in _ENQUEUED:
        if role == "restarted":
            _run_restarted(search, outcomes)
        elif role == "failed":
            _run_failed(search, outcomes)
        else:
            _run_normal(search, role, outcomes)
    for _ in range(_SAMPLED_TRIALS):
        _run_normal(search, "sampled", outcomes)
    missed = {"completed", "pruned", "missing", "restarted", "failed"} - set(outcomes.ids)
    if missed:
        raise RuntimeError(f"the demo search missed {sorted(missed)}; adjust the enqueued trials")
    running_id = _start_running_trial(search)
    return DemoSearch(
        url=url,
        experiment_id=experiment.experiment_id,
        study_name=experiment.study_name,
        multi_objective_experiment_id=0,  # Set by seed_small_search.
        completed_trial_id=outcomes.ids["completed"],
        pruned_trial_id=outcomes.ids["pruned"],
        failed_trial_id=outcomes.ids["failed"],
        restarted_trial_id=outcomes.ids["restarted"],
        running_trial_id=running_id,
        missing_checkpoint_trial_id=outcomes.ids["missing"],
        missing_checkpoint_path=outcomes.missing_path,
        downloadable_checkpoint_path=outcomes.downloadable_path,
    )


def _multi_objective_search(url: str, root: Path, data: _Data, seed: int) -> int:
    """``regression-cost``: NSGA-II on val_loss and slot_seconds with MO-ASHA (a rung at
    epoch 1), 4 trials, COMPLETED. The second is pruned there for sure: trial 0 (the small
    search's "completed" settings) has a lower loss at the rung and as little compute (the
    stand-in's runs record no training start, so every trial's compute counts 0)."""
    raw = experiment_config(
        "regression-cost",
        max_trials=4,
        checkpoint_dir=root / "checkpoints",
        objectives=("slot_seconds",),
        epochs=2,
        seed=seed,
        pruner={"name": "asha", "min_resource": 1, "reduction_factor": 3},
    )
    experiment = _create_experiment(url, raw, root)
    search = _SearchRun(experiment, data, root / "logs-cost")
    enqueued = dict(_ENQUEUED)
    for role in ("completed", "pruned"):
        search.study.enqueue_trial(enqueued[role])
    outcomes = _Outcomes()
    for role in ("completed", "pruned", "sampled", "sampled"):
        _run_normal(search, role, outcomes)
    if "pruned" not in outcomes.ids:
        raise RuntimeError("the multi-objective demo search pruned nothing")
    _complete_experiment(url, experiment.experiment_id)
    return experiment.experiment_id


def seed_small_search(url: str, root: Path, *, seed: int = 0) -> DemoSearch:
    """Run a tiny real search into ``url`` (already migrated); files go under ``root``.

    Takes a few seconds: 12 short trials of a linear model on 64 samples.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for folder in (root, root / "logs", root / "logs-cost"):
        folder.mkdir(parents=True, exist_ok=True)
    data = _make_data(seed)
    demo = _single_objective_search(url, root, data, seed)
    multi_id = _multi_objective_search(url, root, data, seed)
    return dataclasses.replace(demo, multi_objective_experiment_id=multi_id)


def write_cluster_file(path: Path) -> Path:
    """A cluster file (``$SLOTSWEEP_CLUSTER``) declaring every agent the demo data uses."""
    import yaml

    agents = [{"name": AGENT, "host": HOST, "slots": len(AGENT_SLOTS)}]
    agents += [{"name": f"node-{i}", "host": HOST, "slots": 8} for i in range(8)]
    path.write_text(yaml.safe_dump({"resource_pools": [{"name": POOL, "agents": agents}]}))
    return path


# --- The cluster's queue ----------------------------------------------------------------
# Searches sharing a small pool, each driver's bookkeeping as searcher/ writes it, and
# the waiting trials placed (or held back) by the real decision,
# :func:`trials.coordination.cluster_queue.decide`. No trial trains: only the queue matters here.

QUEUE_POOL = "default"
QUEUE_AGENTS = ("a0", "a1")  # 2 slots each
SMALL_POOL = "small"
SMALL_AGENT = "b0"  # 2 slots
_QUEUE_LEASE_S = 300.0


@dataclasses.dataclass(frozen=True)
class QueueDemo:
    """The queue's experiments and the labels (``EXPERIMENT.NUMBER``) of its trials."""

    url: str
    cluster_file: Path
    low_experiment_id: int
    high_experiment_id: int
    paused_experiment_id: int
    running_trial: str
    """``low``'s 1-slot trial, running on a0 (its slot 0)."""
    big_trial: str
    """``high``'s 4-slot priority-1 trial: blocked, it reserves a0 and a1."""
    held_back_trials: tuple[str, ...]
    """``low``'s queued 1-slot trials, kept off a0's free slot by the reservation."""
    new_trial: str
    """``low``'s newest trial, asked after the decision: not in the queue yet."""
    paused_trial: str
    """The QUEUED trial of a paused experiment (its driver took it out of the queue)."""
    placed_trial: str
    """A trial of pool ``small`` that a decision placed on b0; its driver starts it next."""
    small_running_trial: str
    """The trial of pool ``small`` whose driver made that decision and started it."""


def write_queue_cluster_file(path: Path) -> Path:
    """A cluster file of pool ``default`` (a0, a1: 2 slots each) and pool ``small`` (b0)."""
    import yaml

    pools = [
        {
            "name": QUEUE_POOL,
            "agents": [{"name": name, "host": HOST, "slots": 2} for name in QUEUE_AGENTS],
        },
        {"name": SMALL_POOL, "agents": [{"name": SMALL_AGENT, "host": HOST, "slots": 2}]},
    ]
    path.write_text(yaml.safe_dump({"resource_pools": pools}))
    return path


def _queue_experiment(
    url: str,
    root: Path,
    name: str,
    *,
    pool: str = QUEUE_POOL,
    priority: int = 42,
    slots: int = 1,
    reuse_workers: bool = False,
) -> tuple[_Experiment, optuna.Study]:
    """A search of ``slots``-slot trials at ``priority`` in ``pool``, its driver alive."""
    raw = experiment_config(name, max_trials=8, checkpoint_dir=root / "checkpoints")
    raw["resources"] = {"slots_per_trial": slots, "resource_pool": pool, "priority": priority}
    if reuse_workers:
        raw["resources"]["reuse_workers"] = True
    experiment = _create_experiment(url, raw, root)
    return experiment, _load_study(experiment)


def _queued_trial(experiment: _Experiment, study: optuna.Study) -> tuple[int, str]:
    """The driver's QUEUED row of a newly asked trial (``new_trial_row``); (id, label)."""
    from searcher.submit.space import suggest_hparams
    from trials.labels import trial_label

    trial = study.ask()
    hparams = suggest_hparams(trial, experiment.config.hyperparameters)
    with session_scope(experiment.url) as session:
        row = Trial(
            experiment_id=experiment.experiment_id,
            optuna_trial_id=optuna_trial_id(experiment.url, experiment.study_name, trial.number),
            optuna_trial_number=trial.number,
            state=TrialState.QUEUED,
            hparams=hparams,
            slots_per_trial=experiment.config.resources.slots_per_trial,
        )
        session.add(row)
        session.flush()
        trial_id = row.id
    return trial_id, trial_label(experiment.experiment_id, trial.number)


def _enqueue(experiment: _Experiment, trial_ids: Sequence[int]) -> None:
    """The driver's tick puts its waiting trials in the cluster's queue."""
    from trials.coordination import cluster_queue

    resources = experiment.config.resources
    entries = [
        cluster_queue.QueueEntry(
            trial_id=trial_id,
            experiment_id=experiment.experiment_id,
            pool=resources.resource_pool,
            slots=resources.slots_per_trial,
            priority=resources.priority,
            weight=resources.weight,
        )
        for trial_id in trial_ids
    ]
    with session_scope(experiment.url) as session:
        cluster_queue.enqueue(session, entries)


def _decide(experiment: _Experiment, cluster_file: Path) -> list[tuple[int, Placement]]:
    """One placement decision over the pool's whole queue, made by this experiment's driver.

    Returns this experiment's placed trials (their queue rows are gone: start them).
    """
    from trials.coordination import cluster_queue
    from trials.executors import load_cluster

    pool = load_cluster(cluster_file).pool(experiment.config.resources.resource_pool)
    with session_scope(experiment.url) as session:
        return cluster_queue.decide(
            session,
            pool,
            experiment_id=experiment.experiment_id,
            lease_s=_QUEUE_LEASE_S,
            processes_gone=lambda trial_id: False,
        )


def _start_trial(url: str, trial_id: int, placement: Placement) -> None:
    """The driver launches a placed trial: RUNNING, its first run open on its slots."""
    with session_scope(url) as session:
        trial = session.get_one(Trial, trial_id)
        trial.state = TrialState.RUNNING
        trial.started_at = utcnow()
        session.add(
            TrialRun(
                trial_id=trial_id,
                attempt=0,
                agents=[
                    {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
                    for part in placement.agents
                ],
            )
        )


def _pause(experiment: _Experiment) -> None:
    """The driver pauses: its trials leave the queue and it gives up the experiment."""
    from trials.coordination import cluster_queue

    with session_scope(experiment.url) as session:
        cluster_queue.leave(session, experiment.experiment_id)
        row = session.get_one(Experiment, experiment.experiment_id)
        row.state = ExperimentState.PAUSED
        row.driver_heartbeat_at = None
        row.driver_pid = None


def seed_cluster_queue(url: str, root: Path) -> QueueDemo:
    """Searches waiting in one queue, as their drivers and the real decision leave it.

    Pool ``default`` (two agents of 2 slots): ``low`` (priority 42) runs one 1-slot
    trial on a0; ``high``'s 4-slot trial of priority 1 is blocked and reserves both
    agents (backfilling), so ``low``'s queued 1-slot trials do not take a0's free slot;
    ``low``'s newest trial is not queued yet. ``paused`` has a QUEUED trial and no queue
    row. Pool ``small`` (b0): ``first``'s driver decided, placing its own trial (started)
    and ``second``'s (placed, waiting for its driver). Takes about a second.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True, exist_ok=True)
    cluster_file = write_queue_cluster_file(root / "cluster.yaml")

    low, low_study = _queue_experiment(url, root, "queue-low")
    high, high_study = _queue_experiment(url, root, "queue-high", priority=1, slots=4)
    paused, paused_study = _queue_experiment(url, root, "queue-paused")
    # low's first trial was placed on a0 before high's arrived, and started.
    running_id, running = _queued_trial(low, low_study)
    _enqueue(low, [running_id])
    ((placed_id, placement),) = _decide(low, cluster_file)
    assert placed_id == running_id and [a.agent.name for a in placement.agents] == ["a0"]
    _start_trial(url, running_id, placement)
    held_back = [_queued_trial(low, low_study) for _ in range(2)]
    big_id, big = _queued_trial(high, high_study)
    paused_id, paused_label = _queued_trial(paused, paused_study)
    _enqueue(low, [trial_id for trial_id, _ in held_back])
    _enqueue(high, [big_id])
    _enqueue(paused, [paused_id])
    _pause(paused)
    if _decide(low, cluster_file):
        raise RuntimeError("the reservation for the 4-slot trial should keep a0's slot free")
    _new_id, new = _queued_trial(low, low_study)

    first, first_study = _queue_experiment(url, root, "queue-first", pool=SMALL_POOL)
    second, second_study = _queue_experiment(url, root, "queue-second", pool=SMALL_POOL)
    first_id, first_label = _queued_trial(first, first_study)
    second_id, second_label = _queued_trial(second, second_study)
    _enqueue(first, [first_id])
    _enqueue(second, [second_id])
    ((started_id, started_on),) = _decide(first, cluster_file)
    _start_trial(url, started_id, started_on)
    return QueueDemo(
        url=url,
        cluster_file=cluster_file,
        low_experiment_id=low.experiment_id,
        high_experiment_id=high.experiment_id,
        paused_experiment_id=paused.experiment_id,
        running_trial=running,
        big_trial=big,
        held_back_trials=tuple(label for _, label in held_back),
        new_trial=new,
        paused_trial=paused_label,
        placed_trial=second_label,
        small_running_trial=first_label,
    )


# --- Warm jobs ---------------------------------------------------------------------------
# A search with ``resources.reuse_workers``: its trials' jobs outlive them. The jobs are
# opened, handed back, reserved, handed over and asked to end by the code that does it
# in a real search (trials.coordination.warm_jobs, rank 0's trials.runtime._warm.WarmChannel and
# the real placement decision); no process runs.

WARM_POOL = "default"
WARM_AGENTS = ("w0", "w1", "w2", "w3", "w4")  # 2 slots each


@dataclasses.dataclass(frozen=True)
class WarmDemo:
    """Four warm jobs of one search (2 slots each, one agent each) and a free agent."""

    url: str
    cluster_file: Path
    experiment_id: int
    running_job: int
    """Ran ``finished_trials[0]``, now runs ``running_trial``."""
    running_trial: str
    reserved_job: int
    """Ran ``finished_trials[1]``; a decision reserved it for ``reserved_trial``."""
    reserved_trial: str
    idle_job: int
    """Ran ``finished_trials[2]`` and waits for the next trial of its shape."""
    ending_job: int
    """Ran ``finished_trials[3]``; its driver asked it to end (no trial of its shape waits)."""
    finished_trials: tuple[str, ...]
    agents: dict[int, str]
    """Job id -> the agent whose 2 slots it holds."""


def write_warm_cluster_file(path: Path) -> Path:
    """A cluster file of pool ``default``: agents w0..w4 of 2 slots each."""
    import yaml

    agents = [{"name": name, "host": HOST, "slots": 2} for name in WARM_AGENTS]
    path.write_text(yaml.safe_dump({"resource_pools": [{"name": WARM_POOL, "agents": agents}]}))
    return path


def _start_warm(url: str, experiment_id: int, trial_id: int, placement: Placement) -> int:
    """The driver launches a trial of a ``reuse_workers`` search: a new warm job; its id."""
    from trials.coordination import warm_jobs

    with session_scope(url) as session:
        trial = session.get_one(Trial, trial_id)
        trial.state = TrialState.RUNNING
        trial.started_at = utcnow()
        run = TrialRun(
            trial_id=trial_id,
            attempt=0,
            agents=warm_jobs.placement_record(placement),
            launch_token=_uuid.uuid4().hex,
        )
        session.add(run)
        session.flush()
        return warm_jobs.open_job(session, run, placement, experiment_id=experiment_id)


def _hand_back(url: str, experiment_id: int, job_id: int, trial_id: int) -> None:
    """The trial on a warm job completed: rank 0 hands the job back, the driver records it."""
    from types import SimpleNamespace

    from trials.runtime._warm import WarmChannel

    spec = SimpleNamespace(
        warm=SimpleNamespace(job_id=job_id, driver_lease_s=_QUEUE_LEASE_S),
        experiment_id=experiment_id,
        db_url=url,
    )
    channel = WarmChannel(spec, info=None)  # type: ignore[arg-type]  # rank 0's fields only
    if not channel.hand_back(trial_id):
        raise RuntimeError(f"warm job {job_id} does not run trial {trial_id}")
    with session_scope(url) as session:
        run = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial_id)).one()
        run.exit_code = 0
        run.ended_at = utcnow()
        run.reason = "ended; its ranks wait warm for the next trial"
    _finish_trial(url, trial_id, TrialState.COMPLETED)


def _hand_over(url: str, trial_id: int) -> None:
    """The driver takes its trial placed on a reserved warm job and hands the job its run."""
    from trials.coordination import warm_jobs

    with session_scope(url) as session:
        job = warm_jobs.reserved_job(session, trial_id)
        assert job is not None, f"no warm job is reserved for trial {trial_id}"
        session.execute(delete(QueuedTrial).where(QueuedTrial.trial_id == trial_id))
        trial = session.get_one(Trial, trial_id)
        trial.state = TrialState.RUNNING
        trial.started_at = utcnow()
        run = TrialRun(
            trial_id=trial_id,
            attempt=0,
            agents=job.placement,
            launch_token=job.launch_token,
            # Stands in for the runtime spec rank 0 would take: nothing reads it here.
            spec={"trial_id": trial_id},
        )
        session.add(run)
        session.flush()
        warm_jobs.hand_over(session, job.id, run, run.spec or {})


def seed_warm_jobs(url: str, root: Path) -> WarmDemo:
    """Warm jobs in each state, as their search's driver, its ranks and a decision leave them.

    Search ``warm-search`` (2-slot trials, ``reuse_workers``) ran four trials, each on
    a new warm job of one agent, and all four completed: their jobs went idle. Then it
    asked two more trials, and a decision made by another search's driver
    (``warm-bystander``, same pool, nothing queued) reserved the two jobs idle longest
    for them: the first is handed over (running), the second waits for its driver
    (reserved). Of the other two, one stays idle and one its driver asked to end. The
    fifth agent is free. Takes about a second.
    """
    import optuna

    from trials.coordination import warm_jobs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True, exist_ok=True)
    cluster_file = write_warm_cluster_file(root / "cluster.yaml")
    warm, study = _queue_experiment(
        url, root, "warm-search", pool=WARM_POOL, slots=2, reuse_workers=True
    )
    bystander, _ = _queue_experiment(url, root, "warm-bystander", pool=WARM_POOL)

    first = [_queued_trial(warm, study) for _ in range(4)]
    _enqueue(warm, [trial_id for trial_id, _ in first])
    placed = dict(_decide(warm, cluster_file))
    jobs = [
        _start_warm(url, warm.experiment_id, trial_id, placed[trial_id]) for trial_id, _ in first
    ]
    for job_id, (trial_id, _) in zip(jobs, first, strict=True):
        _hand_back(url, warm.experiment_id, job_id, trial_id)
    (next_id, next_label), (reserved_id, reserved_label) = [
        _queued_trial(warm, study) for _ in range(2)
    ]
    _enqueue(warm, [next_id, reserved_id])
    if _decide(bystander, cluster_file):
        raise RuntimeError("the bystander has no trial to place")
    with session_scope(url) as session:
        reserved = dict(
            session.execute(
                select(WarmJob.reserved_trial_id, WarmJob.id).where(
                    WarmJob.reserved_trial_id.is_not(None)
                )
            ).all()
        )
        agents = {
            job_id: placement[0]["agent"]
            for job_id, placement in session.execute(select(WarmJob.id, WarmJob.placement))
        }
    # The jobs idle longest (handed back first) get the trials, in order.
    assert reserved == {next_id: jobs[0], reserved_id: jobs[1]}, reserved
    _hand_over(url, next_id)
    with session_scope(url) as session:
        warm_jobs.request_end(session, jobs[3], "no trial of its shape waits")
    return WarmDemo(
        url=url,
        cluster_file=cluster_file,
        experiment_id=warm.experiment_id,
        running_job=jobs[0],
        running_trial=next_label,
        reserved_job=jobs[1],
        reserved_trial=reserved_label,
        idle_job=jobs[2],
        ending_job=jobs[3],
        finished_trials=tuple(label for _, label in first),
        agents=agents,
    )


# --- The huge experiment ----------------------------------------------------------------
# Bulk inserts, because Optuna's add_trials takes ~12 s for 1,000 trials on SQLite (one
# transaction per trial) and the benchmark must seed in seconds. The slotsweep rows come
# from the runtime's row builders; Optuna's rows follow its RDB schema.

_HUGE_GPUS = (0, 1)
_HUGE_SAMPLES = 2
_HUGE_TIMING_WINDOWS = 3
_GB = 1_000_000_000


@dataclasses.dataclass
class _HugeRows:
    """Every table's rows of the huge experiment, inserted in one transaction at the end."""

    o_trials: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    o_params: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    o_values: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    o_intermediate: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    trials: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    metrics: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    checkpoints: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    system: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    allocations: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def tables(self, url: str) -> tuple[tuple[Any, list[dict[str, Any]]], ...]:
        """(table, rows) in an order that satisfies every foreign key."""
        o_trials, o_params, o_values, o_intermediate = _optuna_tables(
            url, "trials", "trial_params", "trial_values", "trial_intermediate_values"
        )
        return (
            (o_trials, self.o_trials),
            (o_params, self.o_params),
            (o_values, self.o_values),
            (o_intermediate, self.o_intermediate),
            (Trial.__table__, self.trials),
            (TrialRun.__table__, self.runs),
            (Metric.__table__, self.metrics),
            (Checkpoint.__table__, self.checkpoints),
            (Timing.__table__, self.timings),
            (SystemMetric.__table__, self.system),
            (Allocation.__table__, self.allocations),
        )


@dataclasses.dataclass(frozen=True)
class _HugeTrial:
    """One synthetic trial of the huge experiment: its ids, outcome and curves."""

    number: int
    optuna_id: int
    trial_id: int
    state: TrialState
    params: dict[str, Any]
    quality: float
    began: _dt.datetime
    ended: _dt.datetime | None
    val_curve: list[float]

    @property
    def agent(self) -> str:
        return f"node-{self.number % 8}"


@dataclasses.dataclass(frozen=True)
class _HugeShape:
    """The huge experiment's sizes, checked against the metric row count asked for."""

    training_steps: int
    validations: int

    @property
    def validation_every(self) -> int:
        return self.training_steps // self.validations

    @classmethod
    def of(cls, n_trials: int, metric_rows: int, validations: int) -> _HugeShape:
        per_trial = metric_rows // n_trials
        validation_rows = 2 * validations
        training_steps = (per_trial - validation_rows) // 2
        if training_steps < validations or per_trial * n_trials != metric_rows:
            raise ValueError(
                f"metric_rows: must be n_trials x (2 x training steps + {validation_rows}) "
                f"with at least {validations} training steps, got {metric_rows} for "
                f"{n_trials} trials"
            )
        return cls(training_steps, validations)


def seed_huge_experiment(
    url: str,
    *,
    n_trials: int = 1000,
    metric_rows: int = 200_000,
    validations_per_trial: int = 10,
    seed: int = 0,
) -> int:
    """Bulk-insert one experiment of ``n_trials`` trials and ``metric_rows`` metric rows.

    The experiment and its Optuna study are created as ``slotsweep run`` creates them;
    the trials are written straight into Optuna's tables (its RDB schema) in one
    transaction, and ``optuna.load_study`` reads them back like any other study.
    Returns the experiment id.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shape = _HugeShape.of(n_trials, metric_rows, validations_per_trial)
    raw = experiment_config(
        "huge-search", max_trials=n_trials, checkpoint_dir=Path("/nonexistent")
    )
    raw["searcher"]["max_length"] = {"batches": shape.training_steps}
    experiment = _create_experiment(url, raw, Path("/nonexistent"))
    rows = _HugeRows()
    rng = random.Random(seed)
    next_optuna_id, study_id, next_trial_id = _next_ids(url, experiment.study_name)
    start = utcnow() - _dt.timedelta(hours=12)
    running_slots = 0
    with _no_cyclic_gc():
        for number in range(n_trials):
            trial = _huge_trial(
                experiment,
                shape,
                rng,
                number,
                next_optuna_id + number,
                next_trial_id + number,
                start,
            )
            _add_optuna_rows(rows, experiment, shape, trial, study_id)
            _add_trial_rows(rows, experiment, shape, trial)
            _add_recorded_rows(rows, experiment, shape, trial, rng)
            if trial.state == TrialState.RUNNING:
                running_slots = _add_allocations(rows, experiment, trial, running_slots)
        tables = rows.tables(url)
        with get_engine(url).begin() as conn:
            for table, table_rows in tables:
                for chunk in _chunks(table_rows):
                    conn.execute(table.insert(), chunk)
    return experiment.experiment_id


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Millions of rows built in a loop, without the cyclic collector rescanning them.

    The rows hold no cycles; each collection of the oldest generation walks every row
    built so far, which makes the build quadratic at 10,000 trials.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _optuna_tables(url: str, *names: str) -> list[Any]:
    """Optuna's tables as the database holds them: reflected, since its models are private.

    Their enum columns take the member's name (``"COMPLETE"``), as Optuna stores them.
    """
    import sqlalchemy as sa

    metadata = sa.MetaData()
    return [sa.Table(name, metadata, autoload_with=get_engine(url)) for name in names]


def _next_ids(url: str, study_name: str) -> tuple[int, int, int]:
    """The next Optuna trial id, the study's id and the next slotsweep trial id."""
    import sqlalchemy as sa

    o_trials, studies = _optuna_tables(url, "trials", "studies")
    trials = Trial.__table__
    with get_engine(url).connect() as conn:
        next_optuna_id = int(
            conn.execute(sa.select(sa.func.max(o_trials.c.trial_id))).scalar() or 0
        )
        study_id = int(
            conn.execute(
                sa.select(studies.c.study_id).where(studies.c.study_name == study_name)
            ).scalar_one()
        )
        next_trial_id = int(conn.execute(sa.select(sa.func.max(trials.c.id))).scalar() or 0)
    return next_optuna_id + 1, study_id, next_trial_id + 1


def _huge_trial(
    experiment: _Experiment,
    shape: _HugeShape,
    rng: random.Random,
    number: int,
    optuna_id: int,
    trial_id: int,
    start: _dt.datetime,
) -> _HugeTrial:
    """Draw one trial: 80 % completed, 12 % pruned, 5 % failed, 3 % running."""
    from searcher.submit.space import distributions

    roll = rng.random()
    state = (
        TrialState.COMPLETED
        if roll < 0.8
        else TrialState.PRUNED
        if roll < 0.92
        else TrialState.ERROR
        if roll < 0.97
        else TrialState.RUNNING
    )
    space = distributions(experiment.config.hyperparameters)
    params = {name: _sample(dist, rng) for name, dist in space.items()}
    quality = abs(math.log10(params["lr"]) + 1.5) * 0.3 + rng.random() * 0.2
    began = start + _dt.timedelta(seconds=40 * number)
    ended = None if state == TrialState.RUNNING else began + _dt.timedelta(seconds=35)
    val_curve = [quality + 1.0 / (v + 1) for v in range(shape.validations)]
    return _HugeTrial(number, optuna_id, trial_id, state, params, quality, began, ended, val_curve)


def _add_optuna_rows(
    rows: _HugeRows, experiment: _Experiment, shape: _HugeShape, trial: _HugeTrial, study_id: int
) -> None:
    """The trial in Optuna's tables: state, parameters, value and intermediate values."""
    from optuna.distributions import distribution_to_json
    from optuna.trial import TrialState as OptunaState

    from searcher.submit.space import distributions

    optuna_state = {
        TrialState.COMPLETED: OptunaState.COMPLETE,
        TrialState.PRUNED: OptunaState.PRUNED,
        TrialState.ERROR: OptunaState.FAIL,
        TrialState.RUNNING: OptunaState.RUNNING,
    }[trial.state]
    rows.o_trials.append(
        {
            "trial_id": trial.optuna_id,
            "number": trial.number,
            "study_id": study_id,
            "state": optuna_state.name,
            "datetime_start": trial.began,
            "datetime_complete": trial.ended,
        }
    )
    for name, dist in distributions(experiment.config.hyperparameters).items():
        rows.o_params.append(
            {
                "trial_id": trial.optuna_id,
                "param_name": name,
                "param_value": dist.to_internal_repr(trial.params[name]),
                "distribution_json": distribution_to_json(dist),
            }
        )
    if trial.state == TrialState.COMPLETED:
        rows.o_values.append(
            {
                "trial_id": trial.optuna_id,
                "objective": 0,
                "value": trial.val_curve[-1],
                "value_type": "FINITE",
            }
        )
    for v, value in enumerate(trial.val_curve):
        rows.o_intermediate.append(
            {
                "trial_id": trial.optuna_id,
                "step": (v + 1) * shape.validation_every,
                "intermediate_value": value,
                "intermediate_value_type": "FINITE",
            }
        )


def _add_trial_rows(
    rows: _HugeRows, experiment: _Experiment, shape: _HugeShape, trial: _HugeTrial
) -> None:
    """The driver's rows: the trial and one run per attempt."""
    failed = trial.state == TrialState.ERROR
    restarts = 1 if trial.number % 50 == 7 else 0
    rows.trials.append(
        {
            "id": trial.trial_id,
            "experiment_id": experiment.experiment_id,
            "optuna_trial_id": trial.optuna_id,
            "optuna_trial_number": trial.number,
            "state": trial.state,
            "hparams": trial.params,
            "slots_per_trial": SLOTS_PER_TRIAL,
            "restarts": restarts,
            "log_path": None,
            "searcher_metric_value": None if failed else trial.val_curve[-1],
            "total_batches": shape.training_steps,
            "slot_seconds": 70.0,
            "exit_code": None if trial.ended is None else (1 if failed else 0),
            "error": "rank 0 raised RuntimeError" if failed else None,
            "created_at": trial.began,
            "started_at": trial.began,
            "ended_at": trial.ended,
            "finished_at": trial.ended if trial.state == TrialState.COMPLETED else None,
            "pruned_at": trial.ended if trial.state == TrialState.PRUNED else None,
        }
    )
    for attempt in range(1 + restarts):
        rows.runs.append(
            {
                "trial_id": trial.trial_id,
                "attempt": attempt,
                "started_at": trial.began,
                "ended_at": trial.ended,
                "exit_code": 0 if trial.ended else None,
                "agents": [_node(_HUGE_GPUS, agent=trial.agent)],
                "restored_from_checkpoint": None,
                "restored_from_step": None,
                "reason": None,
            }
        )


def _add_recorded_rows(
    rows: _HugeRows,
    experiment: _Experiment,
    shape: _HugeShape,
    trial: _HugeTrial,
    rng: random.Random,
) -> None:
    """Rank 0's and the sampler's rows: metrics, checkpoints, timings, system metrics."""
    _add_metrics(rows, shape, trial, rng)
    _add_checkpoints(rows, experiment, shape, trial, rng)
    _add_timings(rows, trial, rng)
    _add_system_metrics(rows, trial, rng)


def _add_metrics(
    rows: _HugeRows, shape: _HugeShape, trial: _HugeTrial, rng: random.Random
) -> None:
    lr = trial.params["lr"]
    for step in range(1, shape.training_steps + 1):
        loss = trial.quality + 2.0 / (1 + 0.05 * step) + rng.random() * 0.05
        rows.metrics += metric_rows(
            trial.trial_id,
            step,
            MetricKind.TRAINING,
            {"loss": loss, "lr": lr},
            step / shape.validation_every,
            recorded_at=trial.began + _dt.timedelta(seconds=step * 0.3),
        )
    for v, value in enumerate(trial.val_curve):
        rows.metrics += metric_rows(
            trial.trial_id,
            (v + 1) * shape.validation_every,
            MetricKind.VALIDATION,
            {"val_loss": value, "val_accuracy": 1.0 - value / 3},
            float(v + 1),
            recorded_at=trial.began,
        )


def _add_checkpoints(
    rows: _HugeRows,
    experiment: _Experiment,
    shape: _HugeShape,
    trial: _HugeTrial,
    rng: random.Random,
) -> None:
    from trials import trial_checkpoint_dir
    from trials.runtime._recorder import checkpoint_row

    folder = trial_checkpoint_dir(
        experiment.config.checkpoint_storage.path,
        str(experiment.model_dir),
        experiment.checkpoint_folder,
        trial.trial_id,
    )
    for step in (shape.training_steps // 2, shape.training_steps):
        uuid = str(_uuid.UUID(int=rng.getrandbits(128)))
        validation = min(len(trial.val_curve), step // shape.validation_every) - 1
        rows.checkpoints.append(
            checkpoint_row(
                trial_id=trial.trial_id,
                uuid=uuid,
                step=step,
                epoch=step / shape.validation_every,
                path=folder / uuid,
                size_bytes=4_200_000,
                metrics={"val_loss": trial.val_curve[validation]},
                created_at=trial.began,
            )
        )


def _add_timings(rows: _HugeRows, trial: _HugeTrial, rng: random.Random) -> None:
    from trials.runtime._recorder import timing_rows
    from trials.runtime._timing import PHASES, TimingWindow

    windows = []
    for w in range(_HUGE_TIMING_WINDOWS):
        for p, phase in enumerate(PHASES):
            mean = 0.001 * (p + 1) * (1 + rng.random() * 0.1)
            windows.append(
                TimingWindow(
                    name=phase,
                    start_step=w * 30,
                    end_step=(w + 1) * 30,
                    count=30,
                    mean_s=mean,
                    p50_s=mean * 0.95,
                    p95_s=mean * 1.6,
                    total_s=mean * 30,
                )
            )
    rows.timings += timing_rows(trial.trial_id, windows, recorded_at=trial.began)


def _add_system_metrics(rows: _HugeRows, trial: _HugeTrial, rng: random.Random) -> None:
    from trials._system_metrics import gpu_metrics, memory_metrics, system_metric_rows

    for sample in range(_HUGE_SAMPLES):
        host = {
            "cpu_util_percent": 20 + rng.random() * 60,
            **memory_metrics(64 * _GB, int((16 + rng.random() * 32) * _GB)),
        }
        values: list[tuple[int | None, str, float]] = [(None, k, v) for k, v in host.items()]
        for gpu in _HUGE_GPUS:
            used = int((20 + rng.random() * 40) * _GB)
            util = 60 + rng.random() * 40
            values += [(gpu, k, v) for k, v in gpu_metrics(util, used, 80 * _GB).items()]
        at = trial.began + _dt.timedelta(seconds=5 * sample)
        rows.system += system_metric_rows(trial.trial_id, trial.agent, at, values)


def _add_allocations(
    rows: _HugeRows, experiment: _Experiment, trial: _HugeTrial, running_slots: int
) -> int:
    """The running trial's slots, packed onto the 8-slot nodes; the slots now held."""
    for _ in range(SLOTS_PER_TRIAL):
        agent_index, slot_index = divmod(running_slots, 8)
        rows.allocations.append(
            {
                "resource_pool": POOL,
                "agent": f"node-{agent_index}",
                "host": HOST,
                "slot": slot_index,
                "trial_id": trial.trial_id,
                "experiment_id": experiment.experiment_id,
                "allocated_at": trial.began,
                "lease_expires_at": utcnow() + _dt.timedelta(minutes=5),
            }
        )
        running_slots += 1
    return running_slots


def _chunks(rows: list[dict[str, Any]], size: int = 20_000) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _sample(dist: optuna.distributions.BaseDistribution, rng: random.Random) -> Any:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(dist, CategoricalDistribution):
        return rng.choice(list(dist.choices))
    if isinstance(dist, IntDistribution):
        return rng.randint(dist.low, dist.high)
    if isinstance(dist, FloatDistribution) and dist.log:
        return math.exp(rng.uniform(math.log(dist.low), math.log(dist.high)))
    if isinstance(dist, FloatDistribution):
        return rng.uniform(dist.low, dist.high)
    raise TypeError(f"unsupported distribution {dist!r}")


def main() -> None:  # pragma: no cover - a convenience for looking at the UI by hand
    """``python -m tests._demo_data DB_URL ROOT [--huge]``: seed a database to browse."""
    import argparse

    from storage import upgrade_schema

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("db_url")
    parser.add_argument("root", type=Path)
    parser.add_argument("--huge", action="store_true", help="also add the 1,000-trial experiment")
    args = parser.parse_args()
    upgrade_schema(args.db_url)
    start = time.perf_counter()
    demo = seed_small_search(args.db_url, args.root)
    print(json.dumps(dataclasses.asdict(demo), indent=2))
    print(f"seeded in {time.perf_counter() - start:.1f} s")
    if args.huge:
        print(f"huge experiment id: {seed_huge_experiment(args.db_url)}")


if __name__ == "__main__":  # pragma: no cover
    main()
