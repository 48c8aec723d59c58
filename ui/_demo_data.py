"""Databases to look at and to test the UI against: a small real search and a huge one.

:func:`seed_small_search` runs a genuine, tiny search in-process: a real Optuna study
(TPE sampler, median pruner) asks for hyperparameters, a small torch model trains on
synthetic regression data with each batch split across two simulated ranks (their
losses averaged, as the runtime averages across ranks), validation values are
reported to Optuna and pruned on, checkpoints are written by ``torch.save`` and
restored with ``torch.load(weights_only=True)``, phases are timed and host metrics
sampled with psutil. It records every outcome the UI must show: completed, pruned,
failed after restarts, restarted from a checkpoint, still running with slots held, a
checkpoint deleted by retention and one missing from disk, plus a multi-objective
(cost-aware) experiment. The UI's slow tests look at a real ``slotsweep run`` instead
(``tests/ui/_real_search.py``); this seed stands in for the states such a small run
cannot produce reliably, and keeps the quick tests and ``python -m ui._demo_data``
fast. Its rows have the shapes the driver and the runtime write.

:func:`seed_huge_experiment` bulk-inserts an experiment of 1,000 trials and 200,000
metric rows for the render benchmark and the huge-state test.

Example:
    >>> from storage import upgrade_schema
    >>> upgrade_schema("sqlite:////tmp/demo.db")  # doctest: +SKIP
    >>> demo = seed_small_search("sqlite:////tmp/demo.db", Path("/tmp/demo"))  # doctest: +SKIP
    >>> demo.running_trial_id  # doctest: +SKIP
    7
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import random
import socket
import statistics
import time
import uuid as _uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage import (
    Allocation,
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    SystemMetric,
    Timing,
    Trial,
    TrialRun,
    TrialState,
    get_engine,
    optuna_storage,
    record_metrics,
    session_scope,
    utcnow,
)

if TYPE_CHECKING:
    import optuna
    import torch

PHASES = (
    "dataloader_next",
    "to_device",
    "train_batch",
    "step_lr_schedulers",
    "from_device",
    "reduce_metrics",
)
SLOTS_PER_TRIAL = 2
AGENT = "agent-0"


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


def experiment_config(
    name: str,
    *,
    max_trials: int,
    checkpoint_dir: Path,
    objectives: tuple[str, ...] = (),
) -> dict[str, Any]:
    """An experiment config in the shape ``slotsweep run`` stores (see searcher.config)."""
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
            "max_length": {"epochs": 3},
            "max_concurrent_trials": 2,
            "pruner": {"name": "none" if objectives else "median"},
            "objectives": [{"name": o} for o in objectives],
        },
        "resources": {"slots_per_trial": SLOTS_PER_TRIAL, "resource_pool": "default"},
        "checkpoint_storage": {"path": str(checkpoint_dir), "save_trial_latest": 2},
        "max_restarts": 1,
    }


def _distributions() -> dict[str, optuna.distributions.BaseDistribution]:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    return {
        "global_batch_size": CategoricalDistribution([8, 16]),
        "lr": FloatDistribution(1e-4, 0.3, log=True),
        "optimizer": CategoricalDistribution(["sgd", "adamw"]),
        "warmup_epochs": IntDistribution(0, 1),
    }


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


class _Crash(RuntimeError):
    """A rank dying mid-run, as the launcher would see it."""


@dataclasses.dataclass
class _RunResult:
    val_loss: float | None
    pruned: bool
    batches: int
    last_checkpoint: tuple[str, int] | None


class _TrialRecorder:
    """Trains one trial attempt and records it the way the runtime's rank 0 does."""

    def __init__(self, url: str, root: Path, data: _Data, trial_id: int, log_path: Path) -> None:
        self.url = url
        self.root = root
        self.data = data
        self.trial_id = trial_id
        self.log_path = log_path
        self.timings: dict[str, list[float]] = {phase: [] for phase in PHASES}
        self.window_start = 0

    def log(self, rank: int | None, message: str) -> None:
        prefix = f"[rank {rank}] " if rank is not None else ""
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{prefix}{message}\n")

    def _flush_timings(self, end_step: int) -> None:
        rows = []
        for phase, samples in self.timings.items():
            if not samples:
                continue
            ordered = sorted(samples)
            rows.append(
                Timing(
                    trial_id=self.trial_id,
                    name=phase,
                    start_step=self.window_start,
                    end_step=end_step,
                    count=len(samples),
                    mean_s=statistics.fmean(samples),
                    p50_s=statistics.median(samples),
                    p95_s=ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
                    total_s=sum(samples),
                )
            )
            samples.clear()
        if rows:
            with session_scope(self.url) as session:
                session.add_all(rows)
        self.window_start = end_step

    def _sample_system(self) -> None:
        import psutil

        with session_scope(self.url) as session:
            session.add_all(
                [
                    SystemMetric(
                        trial_id=self.trial_id,
                        agent=AGENT,
                        gpu_index=None,
                        name="cpu_util_percent",
                        value=float(psutil.cpu_percent(interval=None)),
                    ),
                    SystemMetric(
                        trial_id=self.trial_id,
                        agent=AGENT,
                        gpu_index=None,
                        name="memory_used_percent",
                        value=float(psutil.virtual_memory().percent),
                    ),
                ]
            )

    def run(
        self,
        hparams: dict[str, Any],
        optuna_trial: optuna.Trial | None,
        *,
        epochs: int,
        restore: tuple[str, int] | None = None,
        crash_after_epoch: int | None = None,
        window: int = 4,
    ) -> _RunResult:
        import torch

        torch.manual_seed(1234)
        model = torch.nn.Linear(8, 1)
        lr = float(hparams["lr"])
        optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
            if hparams["optimizer"] == "sgd"
            else torch.optim.AdamW(model.parameters(), lr=lr)
        )
        batch_size = int(hparams["global_batch_size"])
        per_slot = batch_size // SLOTS_PER_TRIAL
        batches_per_epoch = len(self.data.x_train) // batch_size
        warmup_steps = int(hparams["warmup_epochs"]) * batches_per_epoch
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0
        )
        step, first_epoch = 0, 0
        if restore is not None:
            state = torch.load(restore[0], weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["lr_scheduler"])
            step = int(state["step"])
            first_epoch = int(state["epoch"])
            for rank in range(SLOTS_PER_TRIAL):
                self.log(rank, f"restored checkpoint at step {step} from {restore[0]}")
        self.window_start = step
        last_checkpoint = restore
        val_loss: float | None = None
        for epoch in range(first_epoch, epochs):
            order = torch.randperm(
                len(self.data.x_train), generator=torch.Generator().manual_seed(epoch)
            )
            for batch in range(batches_per_epoch):
                t0 = time.perf_counter()
                index = order[batch * batch_size : (batch + 1) * batch_size]
                x, y = self.data.x_train[index], self.data.y_train[index]
                t1 = time.perf_counter()
                x, y = x.contiguous(), y.contiguous()
                t2 = time.perf_counter()
                optimizer.zero_grad()
                # Two ranks, each on its half of the global batch; gradients averaged as DDP does.
                rank_losses = []
                for rank in range(SLOTS_PER_TRIAL):
                    part = slice(rank * per_slot, (rank + 1) * per_slot)
                    loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
                    (loss / SLOTS_PER_TRIAL).backward()
                    rank_losses.append(float(loss.detach()))
                optimizer.step()
                t3 = time.perf_counter()
                scheduler.step()
                t4 = time.perf_counter()
                current_lr = float(scheduler.get_last_lr()[0])
                t5 = time.perf_counter()
                mean_loss = statistics.fmean(rank_losses)
                t6 = time.perf_counter()
                for phase, seconds in zip(
                    PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True
                ):
                    self.timings[phase].append(seconds)
                step += 1
                with session_scope(self.url) as session:
                    record_metrics(
                        session,
                        self.trial_id,
                        step,
                        MetricKind.TRAINING,
                        {"loss": mean_loss, "lr": current_lr},
                        epoch=step / batches_per_epoch,
                    )
                for rank, value in enumerate(rank_losses):
                    self.log(rank, f"epoch {epoch} batch {batch} step {step} loss {value:.4f}")
                if step % window == 0:
                    self._flush_timings(step)
            with torch.no_grad():
                val_loss = float(
                    torch.nn.functional.mse_loss(model(self.data.x_val), self.data.y_val)
                )
            with session_scope(self.url) as session:
                record_metrics(
                    session,
                    self.trial_id,
                    step,
                    MetricKind.VALIDATION,
                    {"val_loss": val_loss},
                    epoch=float(epoch + 1),
                )
                session.get_one(Trial, self.trial_id).total_batches = step
            for rank in range(SLOTS_PER_TRIAL):
                self.log(rank, f"validation after epoch {epoch}: val_loss {val_loss:.4f}")
            self._sample_system()
            last_checkpoint = self._checkpoint(
                model, optimizer, scheduler, step, epoch + 1, val_loss
            )
            if optuna_trial is not None:
                optuna_trial.report(val_loss, epoch + 1)
                if optuna_trial.should_prune():
                    self.log(0, f"pruned by the median pruner after epoch {epoch}")
                    return _RunResult(val_loss, True, step, last_checkpoint)
            if crash_after_epoch is not None and epoch == crash_after_epoch:
                self.log(1, "RuntimeError: simulated loss of rank 1 (the host killed it)")
                raise _Crash(f"rank 1 died after epoch {epoch}")
        self._flush_timings(step)
        return _RunResult(val_loss, False, step, last_checkpoint)

    def _checkpoint(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        step: int,
        epoch: int,
        val_loss: float,
    ) -> tuple[str, int]:
        import torch

        checkpoint_uuid = str(_uuid.uuid4())
        folder = self.root / "checkpoints" / f"trial-{self.trial_id}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{checkpoint_uuid}.pt"
        partial = path.with_suffix(".pt.partial")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": scheduler.state_dict(),
                "step": step,
                "epoch": epoch,
            },
            partial,
        )
        os.replace(partial, path)  # Atomic, as the runtime writes checkpoints.
        with session_scope(self.url) as session:
            session.add(
                Checkpoint(
                    uuid=checkpoint_uuid,
                    trial_id=self.trial_id,
                    step=step,
                    epoch=float(epoch),
                    path=str(path),
                    size_bytes=path.stat().st_size,
                    metrics={"val_loss": val_loss},
                    state=CheckpointState.COMPLETED,
                )
            )
        return str(path), step


def _new_trial_row(
    url: str, experiment_id: int, trial: optuna.Trial, hparams: dict[str, Any], log_dir: Path
) -> tuple[int, Path]:
    with session_scope(url) as session:
        row = Trial(
            experiment_id=experiment_id,
            optuna_trial_id=trial._trial_id,
            optuna_trial_number=trial.number,
            state=TrialState.RUNNING,
            hparams=hparams,
            slots_per_trial=SLOTS_PER_TRIAL,
            started_at=utcnow(),
        )
        session.add(row)
        session.flush()
        trial_id = row.id
        log_path = log_dir / f"trial-{trial_id}.log"
        row.log_path = str(log_path)
    return trial_id, log_path


def _node(slots: list[int], agent: str = AGENT) -> dict[str, Any]:
    # One node of a launch as the driver records it in ``TrialRun.agents`` (it adds the
    # torchrun pid and spec path, which only the driver's own recovery reads).
    return {"agent": agent, "host": "127.0.0.1", "slots": slots}


def _start_run(url: str, trial_id: int, attempt: int, restore: tuple[str, int] | None) -> int:
    with session_scope(url) as session:
        checkpoint_uuid = Path(restore[0]).stem if restore else None
        run = TrialRun(
            trial_id=trial_id,
            attempt=attempt,
            agents=[_node(list(range(SLOTS_PER_TRIAL)))],
            restored_from_checkpoint=checkpoint_uuid,
            restored_from_step=restore[1] if restore else None,
        )
        session.add(run)
        session.flush()
        return run.id


def _end_run(url: str, run_id: int, exit_code: int, reason: str | None = None) -> None:
    with session_scope(url) as session:
        run = session.get_one(TrialRun, run_id)
        run.ended_at = utcnow()
        run.exit_code = exit_code
        run.reason = reason


def _finish_trial(
    url: str,
    trial_id: int,
    state: TrialState,
    value: float | None,
    batches: int | None,
    *,
    restarts: int = 0,
    exit_code: int | None = 0,
    error: str | None = None,
) -> None:
    with session_scope(url) as session:
        row = session.get_one(Trial, trial_id)
        row.state = state
        row.searcher_metric_value = value
        if batches is not None:  # None: keep what the recorder counted.
            row.total_batches = batches
        row.restarts = restarts
        row.ended_at = utcnow()
        row.exit_code = exit_code
        row.error = error
        started = row.started_at or row.ended_at
        row.slot_seconds = (row.ended_at - started).total_seconds() * SLOTS_PER_TRIAL
        if state == TrialState.COMPLETED:
            row.finished_at = row.ended_at
        if state == TrialState.PRUNED:
            row.pruned_at = row.ended_at


def _create_experiment(
    url: str, name: str, study_name: str, config: dict[str, Any], model_dir: Path
) -> int:
    with session_scope(url) as session:
        experiment = Experiment(
            name=name,
            study_name=study_name,
            state=ExperimentState.ACTIVE,
            config=config,
            model_dir=str(model_dir),
            max_trials=int(config["searcher"]["max_trials"]),
            driver_host=socket.gethostname(),
            driver_pid=os.getpid(),
            driver_heartbeat_at=utcnow(),
        )
        session.add(experiment)
        session.flush()
        return experiment.id


def seed_small_search(url: str, root: Path, *, seed: int = 0) -> DemoSearch:
    """Run a tiny real search into ``url`` (already migrated); files go under ``root``.

    Takes about a second: 9 short trials of a linear model on 64 samples.
    """
    import optuna
    from optuna.trial import TrialState as OptunaState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True, exist_ok=True)
    log_dir = root / "logs"
    log_dir.mkdir(exist_ok=True)
    data = _make_data(seed)
    epochs = 3

    # --- A single-objective search: TPE with a median pruner. ---
    name = "regression-demo"
    study_name = f"{name}-{_uuid.uuid4().hex[:8]}"
    config = experiment_config(name, max_trials=8, checkpoint_dir=root / "checkpoints")
    experiment_id = _create_experiment(url, name, study_name, config, root)
    study = optuna.create_study(
        study_name=study_name,
        storage=optuna_storage(url),
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    _set_metric_names(study, ["val_loss"])
    # The first trials are enqueued so each outcome the UI must show happens for sure.
    for params in (
        {"global_batch_size": 8, "lr": 0.05, "optimizer": "sgd", "warmup_epochs": 0},
        {"global_batch_size": 16, "lr": 0.1, "optimizer": "adamw", "warmup_epochs": 1},
        {"global_batch_size": 16, "lr": 1.2e-4, "optimizer": "sgd", "warmup_epochs": 1},
        {"global_batch_size": 16, "lr": 0.2, "optimizer": "adamw", "warmup_epochs": 0},
        {"global_batch_size": 16, "lr": 0.01, "optimizer": "sgd", "warmup_epochs": 0},
    ):
        study.enqueue_trial(params)
    ids: dict[str, int] = {}
    missing_path = ""
    downloadable_path = ""
    for index in range(7):
        trial = study.ask(_distributions())
        hparams = dict(trial.params)
        trial_id, log_path = _new_trial_row(url, experiment_id, trial, hparams, log_dir)
        recorder = _TrialRecorder(url, root, data, trial_id, log_path)
        recorder.log(None, f"torchrun: launching {SLOTS_PER_TRIAL} ranks on {AGENT}")
        role = {0: "completed", 1: "second", 2: "pruned", 3: "restarted", 4: "failed"}.get(
            index, "sampled"
        )
        run_id = _start_run(url, trial_id, 0, None)
        if role == "restarted":
            try:
                recorder.run(hparams, trial, epochs=epochs, crash_after_epoch=0)
            except _Crash as crash:
                _end_run(url, run_id, -9, f"{crash}; restarting from the latest checkpoint")
            with session_scope(url) as session:
                latest = (
                    session.query(Checkpoint)
                    .filter_by(trial_id=trial_id)
                    .order_by(Checkpoint.step.desc())
                    .first()
                )
                assert latest is not None
                restore = (latest.path, latest.step)
            run_id = _start_run(url, trial_id, 1, restore)
            result = recorder.run(hparams, trial, epochs=epochs, restore=restore)
            _end_run(url, run_id, 0)
            state = TrialState.PRUNED if result.pruned else TrialState.COMPLETED
            if result.pruned:
                study.tell(trial, state=OptunaState.PRUNED)
            else:
                study.tell(trial, result.val_loss)
            _finish_trial(url, trial_id, state, result.val_loss, result.batches, restarts=1)
            ids["restarted"] = trial_id
            continue
        if role == "failed":
            for attempt in range(2):  # max_restarts = 1: the first run and one restart.
                if attempt:
                    run_id = _start_run(url, trial_id, attempt, None)
                try:
                    recorder.run(hparams, None, epochs=epochs, crash_after_epoch=0)
                except _Crash as crash:
                    _end_run(url, run_id, 1, str(crash))
            study.tell(trial, state=OptunaState.FAIL)
            _finish_trial(
                url,
                trial_id,
                TrialState.ERROR,
                None,
                None,
                restarts=1,
                exit_code=1,
                error="rank 1 died after epoch 0 on every attempt; max_restarts (1) exhausted",
            )
            ids["failed"] = trial_id
            continue
        result = recorder.run(hparams, trial, epochs=epochs)
        _end_run(url, run_id, 0)
        if result.pruned:
            study.tell(trial, state=OptunaState.PRUNED)
            _finish_trial(url, trial_id, TrialState.PRUNED, result.val_loss, result.batches)
            ids.setdefault("pruned", trial_id)
        else:
            study.tell(trial, result.val_loss)
            _finish_trial(url, trial_id, TrialState.COMPLETED, result.val_loss, result.batches)
            ids.setdefault("completed", trial_id)
        if role == "completed" and result.last_checkpoint is not None:
            downloadable_path = result.last_checkpoint[0]
        if role == "second" and result.last_checkpoint is not None:
            # Someone removed the newest checkpoint by hand: the UI must say so.
            missing_path = result.last_checkpoint[0]
            os.remove(missing_path)
            ids["missing"] = trial_id
    if not {"completed", "pruned", "missing"} <= set(ids):
        raise RuntimeError(
            f"the demo search missed an outcome ({sorted(ids)}); adjust the enqueued trials"
        )

    # Retention deleted the oldest checkpoint of the first trial.
    with session_scope(url) as session:
        oldest = (
            session.query(Checkpoint)
            .filter_by(trial_id=ids["completed"])
            .order_by(Checkpoint.step)
            .first()
        )
        assert oldest is not None
        Path(oldest.path).unlink(missing_ok=True)
        oldest.state = CheckpointState.DELETED

    # A trial that has just started: slots held, nothing recorded yet.
    trial = study.ask(_distributions())
    running_id, log_path = _new_trial_row(url, experiment_id, trial, dict(trial.params), log_dir)
    _start_run(url, running_id, 0, None)
    _TrialRecorder(url, root, data, running_id, log_path).log(
        None, f"torchrun: launching {SLOTS_PER_TRIAL} ranks on {AGENT}"
    )
    with session_scope(url) as session:
        now = utcnow()
        session.add_all(
            [
                Allocation(
                    resource_pool="default",
                    agent=AGENT,
                    host="127.0.0.1",
                    slot=slot,
                    trial_id=running_id,
                    experiment_id=experiment_id,
                    allocated_at=now,
                    lease_expires_at=now + _dt.timedelta(minutes=5),
                )
                for slot in range(SLOTS_PER_TRIAL)
            ]
        )

    # --- A cost-aware multi-objective search: NSGA-II on val_loss and slot_seconds. ---
    multi_name = "regression-cost"
    multi_study_name = f"{multi_name}-{_uuid.uuid4().hex[:8]}"
    multi_config = experiment_config(
        multi_name, max_trials=4, checkpoint_dir=root / "checkpoints", objectives=("slot_seconds",)
    )
    multi_id = _create_experiment(url, multi_name, multi_study_name, multi_config, root)
    multi = optuna.create_study(
        study_name=multi_study_name,
        storage=optuna_storage(url),
        directions=["minimize", "minimize"],
        sampler=optuna.samplers.NSGAIISampler(seed=seed),
    )
    _set_metric_names(multi, ["val_loss", "slot_seconds"])
    for _ in range(4):
        trial = multi.ask(_distributions())
        hparams = dict(trial.params)
        trial_id, log_path = _new_trial_row(url, multi_id, trial, hparams, log_dir)
        recorder = _TrialRecorder(url, root, data, trial_id, log_path)
        run_id = _start_run(url, trial_id, 0, None)
        result = recorder.run(hparams, None, epochs=2)
        _end_run(url, run_id, 0)
        _finish_trial(url, trial_id, TrialState.COMPLETED, result.val_loss, result.batches)
        with session_scope(url) as session:
            slot_seconds = session.get_one(Trial, trial_id).slot_seconds
        assert result.val_loss is not None
        multi.tell(trial, [result.val_loss, slot_seconds])
    with session_scope(url) as session:
        done = session.get_one(Experiment, multi_id)
        done.state = ExperimentState.COMPLETED
        done.ended_at = utcnow()

    return DemoSearch(
        url=url,
        experiment_id=experiment_id,
        study_name=study_name,
        multi_objective_experiment_id=multi_id,
        completed_trial_id=ids["completed"],
        pruned_trial_id=ids["pruned"],
        failed_trial_id=ids["failed"],
        restarted_trial_id=ids["restarted"],
        running_trial_id=running_id,
        missing_checkpoint_trial_id=ids["missing"],
        missing_checkpoint_path=missing_path,
        downloadable_checkpoint_path=downloadable_path,
    )


# --------------------------------------------------------------------------------------
# The huge experiment: bulk inserts, because Optuna's add_trials takes ~12 s for 1,000
# trials on SQLite (one transaction per trial) and the benchmark must seed in seconds.


def write_cluster_file(path: Path) -> Path:
    """A cluster file (``$SLOTSWEEP_CLUSTER``) declaring every agent the demo data uses."""
    import yaml

    agents = [{"name": AGENT, "host": "127.0.0.1", "slots": 4}]
    agents += [{"name": f"node-{i}", "host": "127.0.0.1", "slots": 8} for i in range(8)]
    path.write_text(yaml.safe_dump({"resource_pools": [{"name": "default", "agents": agents}]}))
    return path


def _chunks(rows: list[dict[str, Any]], size: int = 20_000) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def seed_huge_experiment(
    url: str,
    *,
    n_trials: int = 1000,
    metric_rows: int = 200_000,
    validations_per_trial: int = 10,
    seed: int = 0,
) -> int:
    """Bulk-insert one experiment of ``n_trials`` trials and ``metric_rows`` metric rows.

    The Optuna study is created through Optuna and its trials are written straight into
    Optuna's tables (its RDB schema) in one transaction; ``optuna.load_study`` reads
    them back like any other study. Returns the experiment id.
    """
    import optuna
    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models as optuna_models
    from optuna.trial import TrialState as OptunaState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(seed)
    per_trial = metric_rows // n_trials
    validation_rows = 2 * validations_per_trial
    training_steps = (per_trial - validation_rows) // 2
    if training_steps < validations_per_trial or per_trial * n_trials != metric_rows:
        raise ValueError(
            f"metric_rows: must be n_trials x (2 x training steps + {validation_rows}) with at "
            f"least {validations_per_trial} training steps, got {metric_rows} for {n_trials} trials"
        )
    name = "huge-search"
    study_name = f"{name}-{_uuid.uuid4().hex[:8]}"
    config = experiment_config(name, max_trials=n_trials, checkpoint_dir=Path("/nonexistent"))
    config["searcher"]["max_length"] = {"batches": training_steps}
    experiment_id = _create_experiment(url, name, study_name, config, Path("/nonexistent"))
    study = optuna.create_study(study_name=study_name, storage=optuna_storage(url))
    _set_metric_names(study, ["val_loss"])
    distributions = _distributions()
    engine = get_engine(url)

    with engine.connect() as conn:
        next_optuna_id = (
            int(
                conn.execute(
                    optuna_models.TrialModel.__table__.select()
                    .with_only_columns(optuna_models.TrialModel.__table__.c.trial_id)
                    .order_by(optuna_models.TrialModel.__table__.c.trial_id.desc())
                    .limit(1)
                ).scalar()
                or 0
            )
            + 1
        )
        study_id = int(
            conn.execute(
                optuna_models.StudyModel.__table__.select()
                .with_only_columns(optuna_models.StudyModel.__table__.c.study_id)
                .where(optuna_models.StudyModel.__table__.c.study_name == study_name)
            ).scalar_one()
        )
        next_trial_id = (
            int(
                conn.execute(
                    Trial.__table__.select()
                    .with_only_columns(Trial.__table__.c.id)
                    .order_by(Trial.__table__.c.id.desc())
                    .limit(1)
                ).scalar()
                or 0
            )
            + 1
        )

    start = utcnow() - _dt.timedelta(hours=12)
    o_trials: list[dict[str, Any]] = []
    o_params: list[dict[str, Any]] = []
    o_values: list[dict[str, Any]] = []
    o_intermediate: list[dict[str, Any]] = []
    trials: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    system: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []
    finite = optuna_models.TrialValueModel.TrialValueType.FINITE
    finite_iv = optuna_models.TrialIntermediateValueModel.TrialIntermediateValueType.FINITE
    running_slots = 0
    validation_every = training_steps // validations_per_trial
    for number in range(n_trials):
        optuna_id = next_optuna_id + number
        trial_id = next_trial_id + number
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
        params = {name: _sample(dist, rng) for name, dist in distributions.items()}
        quality = abs(math.log10(params["lr"]) + 1.5) * 0.3 + rng.random() * 0.2
        began = start + _dt.timedelta(seconds=40 * number)
        ended = None if state == TrialState.RUNNING else began + _dt.timedelta(seconds=35)
        val_curve = [quality + 1.0 / (v + 1) for v in range(validations_per_trial)]
        final = val_curve[-1]
        optuna_state = {
            TrialState.COMPLETED: OptunaState.COMPLETE,
            TrialState.PRUNED: OptunaState.PRUNED,
            TrialState.ERROR: OptunaState.FAIL,
            TrialState.RUNNING: OptunaState.RUNNING,
        }[state]
        o_trials.append(
            {
                "trial_id": optuna_id,
                "number": number,
                "study_id": study_id,
                "state": optuna_state,
                "datetime_start": began,
                "datetime_complete": ended,
            }
        )
        for pname, dist in distributions.items():
            o_params.append(
                {
                    "trial_id": optuna_id,
                    "param_name": pname,
                    "param_value": dist.to_internal_repr(params[pname]),
                    "distribution_json": distribution_to_json(dist),
                }
            )
        if state == TrialState.COMPLETED:
            o_values.append(
                {"trial_id": optuna_id, "objective": 0, "value": final, "value_type": finite}
            )
        for v, value in enumerate(val_curve):
            o_intermediate.append(
                {
                    "trial_id": optuna_id,
                    "step": (v + 1) * validation_every,
                    "intermediate_value": value,
                    "intermediate_value_type": finite_iv,
                }
            )
        trials.append(
            {
                "id": trial_id,
                "experiment_id": experiment_id,
                "optuna_trial_id": optuna_id,
                "optuna_trial_number": number,
                "state": state,
                "hparams": params,
                "slots_per_trial": SLOTS_PER_TRIAL,
                "restarts": 1 if number % 50 == 7 else 0,
                "log_path": None,
                "searcher_metric_value": final if state != TrialState.ERROR else None,
                "total_batches": training_steps,
                "slot_seconds": 70.0,
                "exit_code": None if ended is None else (1 if state == TrialState.ERROR else 0),
                "error": "rank 0 raised RuntimeError" if state == TrialState.ERROR else None,
                "created_at": began,
                "started_at": began,
                "ended_at": ended,
                "finished_at": ended if state == TrialState.COMPLETED else None,
                "pruned_at": ended if state == TrialState.PRUNED else None,
            }
        )
        for attempt in range(1 + trials[-1]["restarts"]):
            runs.append(
                {
                    "trial_id": trial_id,
                    "attempt": attempt,
                    "started_at": began,
                    "ended_at": ended,
                    "exit_code": 0 if ended else None,
                    "agents": [_node([0, 1], agent=f"node-{number % 8}")],
                    "restored_from_checkpoint": None,
                    "restored_from_step": None,
                    "reason": None,
                }
            )
        for step in range(1, training_steps + 1):
            at = began + _dt.timedelta(seconds=step * 0.3)
            loss = quality + 2.0 / (1 + 0.05 * step) + rng.random() * 0.05
            for metric_name, value in (("loss", loss), ("lr", params["lr"])):
                metrics.append(
                    {
                        "trial_id": trial_id,
                        "step": step,
                        "epoch": step / validation_every,
                        "kind": MetricKind.TRAINING,
                        "name": metric_name,
                        "value": value,
                        "recorded_at": at,
                    }
                )
        for v, value in enumerate(val_curve):
            step = (v + 1) * validation_every
            for metric_name, metric_value in (
                ("val_loss", value),
                ("val_accuracy", 1.0 - value / 3),
            ):
                metrics.append(
                    {
                        "trial_id": trial_id,
                        "step": step,
                        "epoch": float(v + 1),
                        "kind": MetricKind.VALIDATION,
                        "name": metric_name,
                        "value": metric_value,
                        "recorded_at": began,
                    }
                )
        for c, step in enumerate((training_steps // 2, training_steps)):
            checkpoints.append(
                {
                    "uuid": str(_uuid.UUID(int=rng.getrandbits(128))),
                    "trial_id": trial_id,
                    "step": step,
                    "epoch": step / validation_every,
                    "path": f"/nonexistent/huge/trial-{trial_id}/{c}.pt",
                    "size_bytes": 4_200_000,
                    "metrics": {
                        "val_loss": val_curve[
                            min(len(val_curve) - 1, step // validation_every - 1)
                        ]
                    },
                    "state": CheckpointState.COMPLETED,
                    "created_at": began,
                }
            )
        for w in range(3):
            for p, phase in enumerate(PHASES):
                mean = 0.001 * (p + 1) * (1 + rng.random() * 0.1)
                timings.append(
                    {
                        "trial_id": trial_id,
                        "name": phase,
                        "start_step": w * 30,
                        "end_step": (w + 1) * 30,
                        "count": 30,
                        "mean_s": mean,
                        "p50_s": mean * 0.95,
                        "p95_s": mean * 1.6,
                        "total_s": mean * 30,
                        "recorded_at": began,
                    }
                )
        for sample in range(5):
            at = began + _dt.timedelta(seconds=5 * sample)
            for gpu in (0, 1):
                system.append(
                    {
                        "trial_id": trial_id,
                        "agent": f"node-{number % 8}",
                        "gpu_index": gpu,
                        "name": "gpu_util_percent",
                        "value": 60 + rng.random() * 40,
                        "recorded_at": at,
                    }
                )
            system.append(
                {
                    "trial_id": trial_id,
                    "agent": f"node-{number % 8}",
                    "gpu_index": None,
                    "name": "cpu_util_percent",
                    "value": 20 + rng.random() * 60,
                    "recorded_at": at,
                }
            )
        if state == TrialState.RUNNING:
            for _ in range(SLOTS_PER_TRIAL):
                agent_index, slot_index = divmod(running_slots, 8)
                allocations.append(
                    {
                        "resource_pool": "default",
                        "agent": f"node-{agent_index}",
                        "host": "127.0.0.1",
                        "slot": slot_index,
                        "trial_id": trial_id,
                        "experiment_id": experiment_id,
                        "allocated_at": began,
                        "lease_expires_at": utcnow() + _dt.timedelta(minutes=5),
                    }
                )
                running_slots += 1

    with engine.begin() as conn:
        tables: tuple[tuple[Any, list[dict[str, Any]]], ...] = (
            (optuna_models.TrialModel.__table__, o_trials),
            (optuna_models.TrialParamModel.__table__, o_params),
            (optuna_models.TrialValueModel.__table__, o_values),
            (optuna_models.TrialIntermediateValueModel.__table__, o_intermediate),
            (Trial.__table__, trials),
            (TrialRun.__table__, runs),
            (Metric.__table__, metrics),
            (Checkpoint.__table__, checkpoints),
            (Timing.__table__, timings),
            (SystemMetric.__table__, system),
            (Allocation.__table__, allocations),
        )
        for table, rows in tables:
            for chunk in _chunks(rows):
                conn.execute(table.insert(), chunk)
    return experiment_id


def _set_metric_names(study: optuna.Study, names: list[str]) -> None:
    import optuna

    # Experimental in Optuna since 3.2 and stable in use; the warning is noise here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(names)


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
    """``python -m ui._demo_data DB_URL ROOT [--huge]``: seed a database to browse."""
    import argparse

    from storage import upgrade_schema

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("db_url")
    parser.add_argument("root", type=Path)
    parser.add_argument("--huge", action="store_true", help="also add the 1,000-trial experiment")
    args = parser.parse_args()
    upgrade_schema(args.db_url)
    demo = seed_small_search(args.db_url, args.root)
    print(json.dumps(dataclasses.asdict(demo), indent=2))
    if args.huge:
        print(f"huge experiment id: {seed_huge_experiment(args.db_url)}")


if __name__ == "__main__":  # pragma: no cover
    main()
