"""Overhead of the managed training loop against a hand-written DDP loop, per model shape.

Trains the same model on the same synthetic data for the same number of steps, in the
same torchrun job, once with slotsweep's managed loop (``PyTorchTrial`` through
``run_trial`` with the default config: metric accumulation and all-reduce, phase
timings, recording into a real SQLite database, a final validation and checkpoint) and
once with the loop people write by hand (zero_grad, forward, backward, step). After one
unrecorded round of each, the two alternate ``--repeats`` times (which goes first
alternates too). Steps/s is measured between the start of step ``--warmup`` and the
start of the last step (start-up, the final validation and checkpoint excluded for
both). Printed per shape: each kind's best steps/s and their ratio, the median of the
per-repeat (paired) ratios, and rank 0's CPU time per step of both, which a busy
machine disturbs far less than wall time.

Shapes (``--model``; ``all`` runs the three one after the other, one torchrun job each):

- ``mlp``: MLP 256-512-512-10, 64 samples per rank;
- ``resnet18``: ResNet-18 (torchvision's when installed, else the same network written
  here) on 3x32x32 images, 256 per rank on a GPU, 16 on the CPU;
- ``wide-mlp``: MLP 1024-8192-8192-8192-10, 2048 per rank on a GPU; on the CPU
  1024-1024-1024-1024-10, 128 per rank (the GPU's shape is about 1.8 TFLOP a step).

The data are random rows drawn once (1024 distinct samples, repeated), read one sample
at a time and collated by the data loader on both sides, as a map-style data set is.
Before the runs, the managed loop's per-batch parts are timed one by one on the device
(microseconds of host time per call, and per batch at the default periods).

``--device cuda`` runs on GPUs (1 rank by default; several take NCCL) and refuses to
start without one; ``--device cpu`` runs on the CPU even where there are GPUs (2 ranks
on gloo by default); the default, ``auto``, is CUDA where torch sees a GPU.
``--profiling off`` runs the managed side with ``profiling: {enabled: false}``.

Run:
    .venv/bin/python bench/runtime_overhead.py [--model all] [--device cuda]
Last lines (machine-readable), one per shape:
    model=<m> managed_steps_s=<a> raw_steps_s=<b> ratio=<a/b> median_paired=<c> cpu_ms_raw=<r> cpu_ms_managed=<s>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trials.runtime import DataLoader as ManagedDataLoader
from trials.runtime import PyTorchTrial, PyTorchTrialContext

LR, MOMENTUM = 0.01, 0.9
DISTINCT_SAMPLES = 1024
MODELS = ("mlp", "resnet18", "wide-mlp")


# -- the shapes ------------------------------------------------------------------------------


def mlp(widths: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block: two 3x3 convolutions and a shortcut."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


def resnet18(classes: int) -> nn.Module:
    """torchvision's ``resnet18(num_classes=classes)`` when installed, else the same
    layers (stem 7x7/2 and max-pool, four stages of two basic blocks, average pool)."""
    try:
        from torchvision.models import resnet18 as torchvision_resnet18
    except ImportError:
        pass
    else:
        return torchvision_resnet18(num_classes=classes)
    stages: list[nn.Module] = []
    inputs = 64
    for outputs, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        stages += [BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)]
        inputs = outputs
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, classes),
    )


@dataclass(frozen=True)
class Shape:
    """One model shape: how to build it, its input, and its batch per rank."""

    name: str
    describe: str
    build: Callable[[], nn.Module]
    sample: tuple[int, ...]
    batch: int
    classes: int = 10


def shape(model: str, device_type: str) -> Shape:
    """The shape ``model`` names, sized for ``device_type`` (``cuda`` or ``cpu``)."""
    gpu = device_type == "cuda"
    if model == "mlp":
        widths = (256, 512, 512, 10)
        return Shape(model, "MLP 256-512-512-10", lambda: mlp(widths), (256,), 64)
    if model == "resnet18":
        try:
            import torchvision  # noqa: F401

            source = "torchvision"
        except ImportError:
            source = "the bench's own"
        batch = 256 if gpu else 16
        return Shape(
            model, f"ResNet-18 ({source}) 3x32x32", lambda: resnet18(10), (3, 32, 32), batch
        )
    if model == "wide-mlp":
        width, batch = (8192, 2048) if gpu else (1024, 128)
        widths = (1024, width, width, width, 10)
        describe = "MLP " + "-".join(str(w) for w in widths)
        return Shape(model, describe, lambda: mlp(widths), (1024,), batch)
    raise ValueError(f"--model: {model!r} is not one of {', '.join(MODELS)}, all")


class SyntheticSamples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``length`` samples repeating :data:`DISTINCT_SAMPLES` random ones, read one at a time."""

    def __init__(self, sample: tuple[int, ...], classes: int, length: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(DISTINCT_SAMPLES, *sample, generator=g)
        self.y = torch.randint(0, classes, (DISTINCT_SAMPLES,), generator=g)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = index % DISTINCT_SAMPLES
        return self.x[row], self.y[row]


# -- the two loops -----------------------------------------------------------------------------


class StepClock:
    """Wall time between the start of step ``warmup`` and the start of the last step.

    The process's CPU time (all its threads) over the same steps is kept too: on a
    machine shared with other work it shows the overhead that wall time hides in noise.
    """

    def __init__(self, steps: int, warmup: int, device: torch.device) -> None:
        self.steps, self.warmup, self.device = steps, warmup, device
        self.start = self.end = 0.0
        self.cpu_start = self.cpu_end = 0.0

    def tick(self, step: int) -> None:
        if step in (self.warmup, self.steps - 1):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if step == self.warmup:
                self.start, self.cpu_start = time.perf_counter(), time.process_time()
            else:
                self.end, self.cpu_end = time.perf_counter(), time.process_time()

    def steps_per_s(self) -> float:
        return (self.steps - 1 - self.warmup) / (self.end - self.start)

    def cpu_ms_per_step(self) -> float:
        return 1000 * (self.cpu_end - self.cpu_start) / (self.steps - 1 - self.warmup)


CLOCK: StepClock | None = None


class BenchTrial(PyTorchTrial):
    """The managed side: the same model, data, optimizer and batch as the raw loop."""

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        self.shape = shape(str(context.data["model"]), context.device.type)
        torch.manual_seed(0)
        self.model = context.wrap_model(self.shape.build())
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.data = SyntheticSamples(
            self.shape.sample, self.shape.classes, int(context.data["samples"])
        )

    def build_training_data_loader(self) -> ManagedDataLoader:
        return ManagedDataLoader(self.data, shuffle=True, drop_last=True)

    def build_validation_data_loader(self) -> ManagedDataLoader:
        validation = SyntheticSamples(self.shape.sample, self.shape.classes, 2 * self.shape.batch)
        return ManagedDataLoader(validation)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        assert CLOCK is not None
        CLOCK.tick(batch_idx)
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": self.loss_fn(self.model(x), y)}


def raw_loop(
    model_shape: Shape, steps: int, warmup: int, samples: int, device: torch.device
) -> StepClock:
    """The hand-written baseline: DDP when distributed, a DistributedSampler, SGD."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model: nn.Module = model_shape.build().to(device)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    dataset = SyntheticSamples(model_shape.sample, model_shape.classes, samples)
    sampler: DistributedSampler[Any] | None = (
        DistributedSampler(dataset, shuffle=True) if distributed else None
    )
    loader = DataLoader(
        dataset,
        batch_size=model_shape.batch,
        sampler=sampler,
        shuffle=sampler is None,
        drop_last=True,
    )
    clock = StepClock(steps, warmup, device)
    step, epoch = 0, 0
    while step < steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if step >= steps:
                break
            clock.tick(step)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
        epoch += 1
    return clock


def worker(args: argparse.Namespace) -> None:
    """One rank: alternate the two loops, write rank 0's figures as JSON."""
    from trials import RuntimeSpec
    from trials.runtime._distributed import (
        DistributedInfo,
        destroy_process_group,
        init_process_group,
        select_device,
    )
    from trials.runtime._runner import run_trial

    info = DistributedInfo.from_env()
    device = select_device(info)
    if device.type != args.device:
        sys.exit(f"runtime_overhead: rank {info.rank} got {device}, not {args.device}")
    init_process_group(info, device)
    spec = RuntimeSpec.model_validate_json(Path(os.environ["BENCH_SPEC"]).read_text())
    samples = int(spec.data["samples"])
    model_shape = shape(args.model, device.type)
    results: dict[str, list[float]] = {"managed": [], "raw": []}
    cpu: dict[str, list[float]] = {"managed": [], "raw": []}

    def managed() -> StepClock:
        global CLOCK
        CLOCK = StepClock(args.steps, args.warmup, device)
        outcome = run_trial(spec, info)
        assert outcome == "finished", outcome
        return CLOCK

    def raw() -> StepClock:
        return raw_loop(model_shape, args.steps, args.warmup, samples, device)

    # One unrecorded round first: the first run of each kind pays one-off costs (lazy
    # imports, allocator growth) that are start-up, not per-step overhead.
    raw()
    managed()
    for repeat in range(args.repeats):
        # Alternate which kind goes first, so neither always follows the other.
        order = (("raw", raw), ("managed", managed))
        for kind, run in order if repeat % 2 == 0 else order[::-1]:
            clock = run()
            results[kind].append(clock.steps_per_s())
            cpu[kind].append(clock.cpu_ms_per_step())
    if info.is_chief:
        report = {"results": results, "cpu_ms_per_step": cpu, "device": str(device)}
        Path(os.environ["BENCH_OUT"]).write_text(json.dumps(report))
    destroy_process_group()


# -- the driver side ------------------------------------------------------------------------


def write_spec(
    tmp: Path, args: argparse.Namespace, model_shape: Shape, nproc: int, model: str
) -> Path:
    """A real experiment, trial row and study in a fresh SQLite database, and the spec."""
    import optuna

    from storage import (
        Experiment,
        ExperimentState,
        Trial,
        TrialRun,
        TrialState,
        optuna_storage,
        optuna_trial_id,
        session_scope,
        upgrade_schema,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp / 'bench.db'}"
    upgrade_schema(url)
    study = optuna.create_study(study_name="bench", storage=optuna_storage(url))
    asked = study.ask()
    asked_id = optuna_trial_id(url, "bench", asked.number)
    global_batch = model_shape.batch * nproc
    # Enough samples that the steps fit in one epoch: no epoch-end work on either side.
    samples = global_batch * (args.steps + 1)
    with session_scope(url) as session:
        experiment = Experiment(
            name="bench",
            study_name="bench",
            state=ExperimentState.ACTIVE,
            config={},
            model_dir=str(Path(__file__).parent),
            max_trials=1,
        )
        session.add(experiment)
        session.flush()
        trial = Trial(
            experiment_id=experiment.id,
            optuna_trial_id=asked_id,
            optuna_trial_number=asked.number,
            state=TrialState.RUNNING,
            hparams={"global_batch_size": global_batch},
            slots_per_trial=nproc,
        )
        session.add(trial)
        session.flush()
        session.add(TrialRun(trial_id=trial.id, attempt=0))  # the driver's launch record
        ids = experiment.id, trial.id
        checkpoint_folder = experiment.checkpoint_folder
    spec = {
        "db_url": url,
        "experiment_id": ids[0],
        "checkpoint_folder": checkpoint_folder,
        "trial_id": ids[1],
        "study_name": "bench",
        "optuna_trial_id": asked_id,
        "optuna_trial_number": asked.number,
        "entrypoint": "__main__:BenchTrial",
        "model_dir": str(Path(__file__).parent),
        "hparams": {"global_batch_size": global_batch},
        "data": {"samples": samples, "model": model},
        "slots_per_trial": nproc,
        "max_length": {"batches": args.steps},
        "searcher_metric": "val_loss",
        "pruning": False,
        "min_validation_period": {"batches": args.steps},
        "scratch_dir": str(tmp / "scratch"),
        "checkpoint_storage": {"path": str(tmp / "checkpoints")},
        "profiling": {"enabled": args.profiling == "on"},
        "seed": 0,
    }
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def resolve_device(requested: str) -> str:
    """``cuda`` or ``cpu`` for ``--device``; exits with one line when CUDA is asked for
    but torch sees no GPU."""
    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        sys.exit("runtime_overhead: --device cuda, but torch sees no CUDA device")
    return requested


@dataclass(frozen=True)
class Figures:
    """One shape's result: best steps/s of each kind, paired ratios, CPU ms per step."""

    model: str
    managed_steps_s: float
    raw_steps_s: float
    median_paired: float
    cpu_ms_raw: float
    cpu_ms_managed: float

    @property
    def ratio(self) -> float:
        return self.managed_steps_s / self.raw_steps_s

    def line(self) -> str:
        return (
            f"model={self.model} managed_steps_s={self.managed_steps_s:.3f} "
            f"raw_steps_s={self.raw_steps_s:.3f} ratio={self.ratio:.4f} "
            f"median_paired={self.median_paired:.4f} cpu_ms_raw={self.cpu_ms_raw:.3f} "
            f"cpu_ms_managed={self.cpu_ms_managed:.3f}"
        )


def run_shape(args: argparse.Namespace, model: str, device: str, nproc: int) -> Figures:
    """One torchrun job alternating the two loops on ``model``; prints its figures."""
    model_shape = shape(model, device)
    with tempfile.TemporaryDirectory(prefix="slotsweep-bench-") as tmp_name:
        tmp = Path(tmp_name)
        spec_path = write_spec(tmp, args, model_shape, nproc, model)
        out = tmp / "out.json"
        env = dict(os.environ, BENCH_SPEC=str(spec_path), BENCH_OUT=str(out))
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU, as on a CPU machine
            # One thread a rank, as torchrun sets for several: a rank's idle OpenMP
            # threads spin on a busy machine and swamp the loops' own CPU time.
            env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
        )
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            __file__,
            "--worker",
            f"--model={model}",
            f"--device={device}",
            f"--steps={args.steps}",
            f"--warmup={args.warmup}",
            f"--repeats={args.repeats}",
        ]
        returncode = subprocess.run(command, env=env, check=False).returncode
        if not out.exists():
            sys.exit(
                f"runtime_overhead: the torchrun job of {model} failed (exit code {returncode})"
            )
        if returncode != 0:
            # Rank 0 wrote its figures; a rank that aborted in gloo's teardown after that
            # (a known torchrun flake on this machine) does not invalidate them.
            print(f"note: torchrun exited with {returncode} after the figures were written")
        report = json.loads(out.read_text())
    results, cpu = report["results"], report["cpu_ms_per_step"]
    print(
        f"model={model} ({model_shape.describe}, {model_shape.batch} per rank) "
        f"device={report['device']} ranks={nproc} steps={args.steps} warmup={args.warmup} "
        f"repeats={args.repeats} profiling={args.profiling}"
    )
    for kind in ("raw", "managed"):
        print(f"  {kind:8s} steps/s per repeat: " + " ".join(f"{v:.2f}" for v in results[kind]))
    for kind in ("raw", "managed"):
        print(f"  {kind:8s} rank-0 CPU ms/step: " + " ".join(f"{v:.3f}" for v in cpu[kind]))
    paired = [m / r for m, r in zip(results["managed"], results["raw"], strict=True)]
    figures = Figures(
        model=model,
        managed_steps_s=max(results["managed"]),
        raw_steps_s=max(results["raw"]),
        median_paired=statistics.median(paired),
        cpu_ms_raw=statistics.median(cpu["raw"]),
        cpu_ms_managed=statistics.median(cpu["managed"]),
    )
    print(
        f"  best-of ratio={figures.ratio:.4f}  median of paired ratios={figures.median_paired:.4f}"
        f"  rank-0 CPU ms/step (medians) raw={figures.cpu_ms_raw:.3f}"
        f" managed={figures.cpu_ms_managed:.3f}"
        f" (+{figures.cpu_ms_managed - figures.cpu_ms_raw:.3f})",
        flush=True,
    )
    return figures


# -- the managed loop's per-batch parts, one by one ---------------------------------------


def per_call_us(call: Callable[[], object], number: int) -> float:
    """The best of 5 timings of ``number`` calls, in microseconds per call."""
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def time_parts(device_name: str) -> list[tuple[str, float, float]]:
    """``(part, us per call, calls per batch at the default periods)`` of each per-batch
    part of the managed loop, on ``device_name``'s accelerator, in this process."""
    from trials.config import ProfilingConfig, PrunerSpec
    from trials.runtime import accelerator_for
    from trials.runtime._metrics import MetricAccumulator
    from trials.runtime._preemption import ChiefPreemption
    from trials.runtime._prune_gate import PruneGate
    from trials.runtime._recording import NO_RECORDER
    from trials.runtime._timing import PHASES, PhaseProfiler, WindowedTimings

    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")
    accelerator = accelerator_for(device)
    defaults = ProfilingConfig()
    batch = (torch.randn(64, 256), torch.randint(0, 10, (64,)))
    loss = torch.zeros((), device=device)
    accumulator = MetricAccumulator()

    def accumulate() -> None:
        accumulator.add({"loss": loss})
        if accumulator.weight >= 100:  # as many as a report collects
            accumulator.reset()

    profiler = PhaseProfiler(
        WindowedTimings(defaults.window_batches),
        sample_every=accelerator.timed_every(defaults.sync_every),
        clock=accelerator.phase_clock(),
    )
    step = 0

    def profile_batch() -> None:
        nonlocal step
        step += 1
        profiler.begin_batch()
        for name in PHASES[:4]:
            profiler.lap(name)
        profiler.end_batch(step)

    preemption = ChiefPreemption(NO_RECORDER)
    gate = PruneGate(PrunerSpec(name="SuccessiveHalvingPruner", kwargs={"min_resource": 1}), 1)
    gate.validated(moment=0.0, step=1)
    gate.asked()
    gate.validated(moment=1.0, step=2)
    report_every = PyTorchTrial.scheduling_unit
    parts = [
        ("metric accumulation (one metric)", per_call_us(accumulate, 2000), 1.0),
        ("phase timings (4 laps)", per_call_us(profile_batch, 2000), 1.0),
        (
            "to_device of (64x256, 64)",
            per_call_us(lambda: accelerator.to_device(batch), 2000),
            1.0,
        ),
        ("preemption check", per_call_us(preemption.requested, 2000), 1 / report_every),
        ("prune gate", per_call_us(gate.must_ask, 2000), 0.0),
    ]
    profiler.flush(step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return parts


class IndexBatches(Dataset[list[int]]):
    """``length`` batches of nothing to compute: a batch is its indices (``__getitems__``)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> list[int]:
        return [index]

    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


def _as_is(batch: list[int]) -> list[int]:
    return batch


NOTHING = torch.zeros(())


class NoopTrial(PyTorchTrial):
    """A trial whose batches cost nothing: what is left of a step is the loop's own work."""

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        self.model = context.wrap_model(nn.Linear(1, 1))
        self.length = int(context.data["batches"])

    def build_training_data_loader(self) -> ManagedDataLoader:
        return ManagedDataLoader(IndexBatches(self.length), collate_fn=_as_is)

    def build_validation_data_loader(self) -> ManagedDataLoader:
        return ManagedDataLoader(IndexBatches(1), collate_fn=_as_is)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        return {"loss": NOTHING}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"val_loss": NOTHING}


def loop_us_per_batch(device_name: str, batches: int = 20000) -> dict[str, float]:
    """Host microseconds per batch of the whole managed loop around :class:`NoopTrial`
    (profiling on and off; rank 0 without a database), and of the bare data loader:
    the best of 5 runs each, in this process."""
    from trials import RuntimeSpec
    from trials.runtime import accelerator_for
    from trials.runtime._distributed import DistributedInfo
    from trials.runtime._loop import ManagedLoop

    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")

    def managed(profiling: bool, folder: Path) -> float:
        spec = RuntimeSpec.model_validate(
            {
                "db_url": "sqlite://",
                "experiment_id": 1,
                "checkpoint_folder": "1-bench",
                "trial_id": 1,
                "study_name": "bench",
                "optuna_trial_id": 1,
                "optuna_trial_number": 0,
                "entrypoint": "runtime_overhead:NoopTrial",
                "model_dir": str(folder),
                "hparams": {"global_batch_size": 1},
                "data": {"batches": batches},
                "slots_per_trial": 1,
                "max_length": {"batches": batches},
                "searcher_metric": "val_loss",
                "pruning": False,
                "min_validation_period": {"batches": batches},
                "scratch_dir": str(folder / "scratch"),
                "checkpoint_storage": {"path": str(folder / "checkpoints")},
                "profiling": {"enabled": profiling},
            }
        )
        context = PyTorchTrialContext(spec, DistributedInfo(), accelerator_for(device))
        loop = ManagedLoop(NoopTrial, context)
        start = time.perf_counter()
        loop.run()
        return (time.perf_counter() - start) / batches * 1e6

    def bare() -> float:
        loader = DataLoader(IndexBatches(batches), collate_fn=_as_is)
        start = time.perf_counter()
        for _ in loader:
            pass
        return (time.perf_counter() - start) / batches * 1e6

    best = {"on": math.inf, "off": math.inf, "bare": math.inf}
    with tempfile.TemporaryDirectory(prefix="slotsweep-bench-") as tmp:
        for _ in range(5):  # alternating, so a busy moment of the machine hits all three
            best["on"] = min(best["on"], managed(True, Path(tmp)))
            best["off"] = min(best["off"], managed(False, Path(tmp)))
            best["bare"] = min(best["bare"], bare())
    return best


def print_parts(device: str) -> None:
    print(
        f"managed loop's per-batch parts on {device} (host us per call; per batch at the defaults)"
    )
    for name, us, per_batch in time_parts(device):
        where = "per validation" if per_batch == 0 else f"{us * per_batch:8.3f} us/batch"
        print(f"  {name:34s} {us:8.3f} us/call  {where}")
    loop = loop_us_per_batch(device)
    print(
        f"  the whole loop around a trial that computes nothing: {loop['on'] - loop['bare']:.2f}"
        f" us/batch with profiling, {loop['off'] - loop['bare']:.2f} without, beyond the data"
        f" loader's own {loop['bare']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=(*MODELS, "all"),
        default="mlp",
        help="the model shape, or all three one after the other (default: mlp)",
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where the ranks train (default: cuda where torch sees a GPU, else cpu)",
    )
    parser.add_argument(
        "--nproc", type=int, default=None, help="ranks (default: 1 on a GPU, else 2)"
    )
    parser.add_argument(
        "--profiling",
        choices=("on", "off"),
        default="on",
        help="the managed side's phase timings (default: on, as the default config)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < args.warmup + 2:
        parser.error(f"--steps must be at least --warmup + 2 ({args.warmup + 2})")
    if args.worker:
        from trials.node.exiting import exit_without_teardown

        worker(args)
        exit_without_teardown(0)  # as the product's worker ends a rank
    device = resolve_device(args.device)
    nproc = args.nproc or (1 if device == "cuda" else 2)
    print_parts(device)
    models = MODELS if args.model == "all" else (args.model,)
    figures = [run_shape(args, model, device, nproc) for model in models]
    for one in figures:
        print(one.line())


if __name__ == "__main__":
    main()
