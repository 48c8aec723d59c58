"""Overhead of the managed training loop against a hand-written DDP loop.

Trains the same MLP on the same data for the same number of steps, in the same
torchrun job, once with slotsweep's managed loop (``PyTorchTrial`` through
``run_trial``: metric accumulation and all-reduce, timings, recording into a real
SQLite database, a final validation and checkpoint) and once with the loop people
write by hand (zero_grad, forward, backward, step). After one unrecorded round of
each, the two alternate ``--repeats`` times (which goes first alternates too); each
kind's best steps/s is reported, so a noisy neighbour on the machine penalises neither
side more than the other. Steps/s is measured between the start of step ``--warmup``
and the start of the last step (start-up excluded for both). Also printed: the median
of the per-repeat ratios and rank 0's CPU time per step of both, which a busy machine
disturbs far less than wall time.

``--device cuda`` runs on GPUs (1 rank by default; several take NCCL) and refuses to
start without one; ``--device cpu`` runs on the CPU even where there are GPUs (2 ranks
on gloo by default); the default, ``auto``, is CUDA where torch sees a GPU. ``--nproc``
changes the number of ranks.

Run:
    .venv/bin/python bench/runtime_overhead.py [--device cuda]
Last line (machine-readable):
    managed_steps_s=<a> raw_steps_s=<b> ratio=<a/b>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trials.runtime import DataLoader as ManagedDataLoader
from trials.runtime import PyTorchTrial, PyTorchTrialContext

IN, HIDDEN, OUT = 256, 512, 10
PER_SLOT_BATCH = 64
LR, MOMENTUM = 0.01, 0.9


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, OUT),
    )


def make_dataset(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(samples, IN, generator=g), torch.randint(0, OUT, (samples,), generator=g)
    )


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
        self.model = context.wrap_model(make_model())
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.data = make_dataset(int(context.data["samples"]))

    def build_training_data_loader(self) -> ManagedDataLoader:
        return ManagedDataLoader(self.data, shuffle=True, drop_last=True)

    def build_validation_data_loader(self) -> ManagedDataLoader:
        return ManagedDataLoader(TensorDataset(*self.data[:512]), batch_size=256)

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


def raw_loop(steps: int, warmup: int, samples: int, device: torch.device) -> StepClock:
    """The hand-written baseline: DDP when distributed, a DistributedSampler, SGD."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model: nn.Module = make_model().to(device)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()
    dataset = make_dataset(samples)
    sampler: DistributedSampler[Any] | None = (
        DistributedSampler(dataset, shuffle=True) if distributed else None
    )
    loader = DataLoader(
        dataset,
        batch_size=PER_SLOT_BATCH,
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
    results: dict[str, list[float]] = {"managed": [], "raw": []}
    cpu: dict[str, list[float]] = {"managed": [], "raw": []}

    def managed() -> StepClock:
        global CLOCK
        CLOCK = StepClock(args.steps, args.warmup, device)
        outcome = run_trial(spec, info)
        assert outcome == "finished", outcome
        return CLOCK

    def raw() -> StepClock:
        return raw_loop(args.steps, args.warmup, samples, device)

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


def write_spec(tmp: Path, args: argparse.Namespace, nproc: int) -> Path:
    """A real experiment, trial row and study in a fresh SQLite database, and the spec."""
    import optuna

    from storage import (
        Experiment,
        ExperimentState,
        Trial,
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
    global_batch = PER_SLOT_BATCH * nproc
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
        "data": {"samples": samples},
        "slots_per_trial": nproc,
        "max_length": {"batches": args.steps},
        "searcher_metric": "val_loss",
        "pruning": False,
        "min_validation_period": {"batches": args.steps},
        "scratch_dir": str(tmp / "scratch"),
        "checkpoint_storage": {"path": str(tmp / "checkpoints")},
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from trials.node.exiting import exit_without_teardown

        worker(args)
        exit_without_teardown(0)  # as the product's worker ends a rank
    device = resolve_device(args.device)
    nproc = args.nproc or (1 if device == "cuda" else 2)
    with tempfile.TemporaryDirectory(prefix="slotsweep-bench-") as tmp_name:
        tmp = Path(tmp_name)
        spec_path = write_spec(tmp, args, nproc)
        out = tmp / "out.json"
        env = dict(os.environ, BENCH_SPEC=str(spec_path), BENCH_OUT=str(out))
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the ranks see no GPU, as on a CPU machine
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
            f"--device={device}",
            f"--steps={args.steps}",
            f"--warmup={args.warmup}",
            f"--repeats={args.repeats}",
        ]
        returncode = subprocess.run(command, env=env, check=False).returncode
        if not out.exists():
            sys.exit(f"runtime_overhead: the torchrun job failed (exit code {returncode})")
        if returncode != 0:
            # Rank 0 wrote its figures; a rank that aborted in gloo's teardown after that
            # (a known torchrun flake on this machine) does not invalidate them.
            print(f"note: torchrun exited with {returncode} after the figures were written")
        report = json.loads(out.read_text())
    results = report["results"]
    print(
        f"device={report['device']} ranks={nproc} steps={args.steps} warmup={args.warmup} repeats={args.repeats}"
    )
    for kind in ("raw", "managed"):
        print(f"{kind:8s} steps/s per repeat: " + " ".join(f"{v:.2f}" for v in results[kind]))
    for kind in ("raw", "managed"):
        cpu = report["cpu_ms_per_step"][kind]
        print(f"{kind:8s} rank-0 CPU ms/step per repeat: " + " ".join(f"{v:.2f}" for v in cpu))
    paired = sorted(m / r for m, r in zip(results["managed"], results["raw"], strict=True))
    cpu_ratio = statistics.median(report["cpu_ms_per_step"]["raw"]) / statistics.median(
        report["cpu_ms_per_step"]["managed"]
    )
    print(
        f"median of paired ratios={statistics.median(paired):.4f} "
        f"rank-0 CPU time per step raw/managed (medians)={cpu_ratio:.4f}"
    )
    managed, raw = max(results["managed"]), max(results["raw"])
    print(f"managed_steps_s={managed:.3f} raw_steps_s={raw:.3f} ratio={managed / raw:.4f}")


if __name__ == "__main__":
    main()
