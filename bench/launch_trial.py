"""The tiny 2-rank training job of ``bench/launch_overhead.py``, in both of its forms.

- ``torchrun --standalone --nproc-per-node=2 bench/launch_trial.py``: the plain DDP
  script people write (join gloo, wrap the model in DDP, train, leave the group);
- ``entrypoint: launch_trial:slotsweep_main``: the same training through slotsweep's
  core API (the runtime has already joined gloo; the trial reports its final loss as a
  validation metric so that it completes).

Both call :func:`train` and average the final loss across ranks, so the work inside
the job is the same; what differs is what each way of launching adds around it.

When ``LAUNCH_BENCH_STAMPS`` names a folder, every rank appends one JSON line per job to
``stamps.jsonl`` there: wall-clock stamps (torchrun's and this process's start, training
start and end, the moment the interpreter starts to exit) and the CPU time the process
(all its threads) had used at those moments, which the benchmark uses to say where the
time goes. The line is written by an ``atexit`` handler, after everything the
launcher's code does in the rank.

On a warm job (``resources.reuse_workers``) one process runs trial after trial, and
slotsweep imports this module afresh for each: every import registers its own handler,
so the job's ranks write one line per trial when they exit at the job's end. Each line
carries its ``trial_id``; its ``module_import``, ``train_start`` and ``reported`` stamps
are that trial's, while the process, torchrun and exit stamps are the job's.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import time
from typing import Any

_T_IMPORT = time.time()

import torch  # noqa: E402  (the stamp above measures what this import costs)
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

_T_TORCH = time.time()

STEPS = 20
PER_SLOT_BATCH = 16
IN, HIDDEN, OUT = 32, 64, 10
STAMPS_ENV = "LAUNCH_BENCH_STAMPS"


def _cpu_s() -> float:
    """CPU seconds this process (every thread) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def train(device: torch.device) -> tuple[float, dict[str, Any]]:
    """``STEPS`` DDP steps of a tiny MLP; the loss averaged over ranks, and stamps."""
    from torch.nn.parallel import DistributedDataParallel

    stamps: dict[str, Any] = {"train_start": time.time(), "cpu_train_start": _cpu_s()}
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    model = DistributedDataParallel(model.to(device))
    stamps["ddp_built"] = time.time()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(dist.get_rank())
    loss = torch.zeros(())
    for _ in range(STEPS):
        x = torch.randn(PER_SLOT_BATCH, IN, generator=generator)
        y = torch.randint(0, OUT, (PER_SLOT_BATCH,), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
    stamps["train_end"] = time.time()
    return float(loss.detach()), stamps


def _process_start_time(pid: int | str = "self") -> float:
    """A process's start in wall-clock seconds, from /proc (no psutil import)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        # Field 22 (starttime, clock ticks since boot), counted after the command name
        # (which may hold spaces, hence the split at its closing parenthesis).
        start_ticks = int(f.read().rpartition(")")[2].split()[19])
    # /proc/uptime (10 ms resolution) rather than btime (whole seconds) for the boot time.
    with open("/proc/uptime", encoding="ascii") as f:
        boot = time.time() - float(f.read().split()[0])
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


# This import's records (one per trial run with it), written at the interpreter's exit.
_RECORDS: list[dict[str, Any]] = []


def _write_stamps() -> None:
    folder = os.environ.get(STAMPS_ENV)
    if not folder or not _RECORDS:
        return
    job = {
        "torchrun_pid": os.getppid(),
        "torchrun_start": _process_start_time(os.getppid()),
        "process_start": _process_start_time(),
        "torch_imported": _T_TORCH,
        "exiting": time.time(),
        "cpu_exiting": _cpu_s(),
    }
    with open(os.path.join(folder, "stamps.jsonl"), "a", encoding="utf-8") as f:
        for stamps in _RECORDS:
            f.write(json.dumps({**stamps, **job}) + "\n")


def _keep_stamps(kind: str, stamps: dict[str, Any]) -> None:
    """Write ``stamps`` when this rank's interpreter starts to exit."""
    if not os.environ.get(STAMPS_ENV):
        return
    stamps["cpu_reported"] = _cpu_s()
    stamps.update(
        kind=kind, rank=int(os.environ.get("RANK", "0")), pid=os.getpid(), module_import=_T_IMPORT
    )
    if not _RECORDS:
        atexit.register(_write_stamps)
    _RECORDS.append(stamps)


def slotsweep_main(context: Any) -> None:
    """The core-API entrypoint: train, report the averaged loss as ``val_loss``.

    The stamps' folder comes as the hyperparameter ``stamps_dir``: the ranks of a Ray
    node start with that node's environment, not the driver's.
    """
    os.environ[STAMPS_ENV] = str(context.hparams["stamps_dir"])
    loss, stamps = train(context.device)
    # report_validation_metrics averages across ranks (one all-reduce), like the
    # bare script's all_reduce below, and records the value so the trial completes.
    means = context.report_validation_metrics(STEPS, {"val_loss": loss})
    stamps["reported"] = time.time()
    _keep_stamps("slotsweep", {**stamps, "trial_id": context.trial_id})
    if context.is_chief:
        print(f"final loss {means['val_loss']:.4f}", flush=True)


def _bare_main() -> None:
    dist.init_process_group("gloo")
    try:
        loss, stamps = train(torch.device("cpu"))
        averaged = torch.tensor([loss])
        dist.all_reduce(averaged)
        averaged /= dist.get_world_size()
        stamps["reported"] = time.time()
        _keep_stamps("bare", stamps)
        if dist.get_rank() == 0:
            print(f"final loss {averaged.item():.4f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _bare_main()
