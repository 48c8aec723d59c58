"""``optimizations.auto_tune_tensor_fusion``: the fastest DDP bucket size, measured.

DDP fuses gradients into buckets of ``bucket_cap_mb`` before each all-reduce. Small
buckets start exchanging sooner (overlap with the backward pass) but pay a latency per
message; large ones pay it less often. Which wins depends on the model, the world size
and the interconnect, so the runtime measures it where the trial runs.

How: before the model is wrapped, every rank wraps a stand-in with the model's own
parameters' shapes and dtypes (zero-filled copies, so the model itself is not touched)
in DDP once per candidate size, with the configured gradient-compression hook, and
times a bounded number of forward + backward passes (each backward all-reduces every
gradient, bucket by bucket). The step times are reduced to their maximum over the
ranks (a step lasts as long as its slowest rank), so every rank holds the same numbers
and picks the same size. The model is then wrapped once, with that size: training is
exactly that of a fixed ``tensor_fusion_threshold`` of the chosen size.

Rank 0 records the choice for the search (``storage.FusionChoice``) and each size's
step times as the trial's timings (``tensor_fusion_<size>mb``); a later trial with the
same model shape, compression and world size re-uses the choice without probing.
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations at runtime.
import hashlib
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trials.config import OptimizationsConfig
from trials.runtime._ddp import register_comm_hook
from trials.runtime._distributed import broadcast_object
from trials.runtime._recording import Recorder
from trials.runtime._timing import TimingWindow, summarize

# The sizes Determined's and Horovod's tuners range over, plus the configured threshold.
CANDIDATE_BUCKETS_MB = (1.0, 4.0, 16.0, 64.0)
# Untimed passes first: DDP rebuilds its buckets after the first backward.
WARMUP_STEPS = 3
PROBE_STEPS = 10


def candidate_buckets(threshold_mb: float) -> list[float]:
    """The sizes to try: the standard ones and the configured threshold, ascending.

    Example:
        >>> candidate_buckets(25.0)
        [1.0, 4.0, 16.0, 25.0, 64.0]
    """
    return sorted({*CANDIDATE_BUCKETS_MB, float(threshold_mb)})


def fastest_bucket(step_times: Mapping[float, Sequence[float]]) -> float:
    """The size whose median step time is lowest (the smaller size on a tie).

    Example:
        >>> fastest_bucket({1.0: [0.3, 0.3], 16.0: [0.2, 0.25], 64.0: [0.2, 0.4]})
        16.0
    """
    if not step_times:
        raise ValueError("no bucket size was timed")
    return min(sorted(step_times), key=lambda size: statistics.median(step_times[size]))


def timing_name(bucket_mb: float) -> str:
    """The ``Timing`` name of one probed size's step times.

    Example:
        >>> timing_name(16.0), timing_name(2.5)
        ('tensor_fusion_16mb', 'tensor_fusion_2.5mb')
    """
    return f"tensor_fusion_{bucket_mb:g}mb"


def exchanged(module: torch.nn.Module) -> tuple[int, int]:
    """The trained parameters' count and their gradients' bytes (before compression).

    Example:
        >>> exchanged(torch.nn.Linear(4, 2))
        (10, 40)
    """
    trained = [p for p in module.parameters() if p.requires_grad]
    return sum(p.numel() for p in trained), sum(p.numel() * p.element_size() for p in trained)


def shape_key(module: torch.nn.Module, optimizations: OptimizationsConfig) -> str:
    """A digest of what decides the best size: the trained parameters' shapes and dtypes,
    in order, and the gradient compression (it changes the bytes on the wire)."""
    parts = [f"{tuple(p.shape)}:{p.dtype}" for p in module.parameters() if p.requires_grad]
    parts.append(f"compression={optimizations.gradient_compression}")
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:32]


class _GradientStandIn(torch.nn.Module):
    """Zero-filled parameters shaped like a model's; its loss is their sum of squares.

    Its backward produces one gradient per parameter, in DDP's order, at almost no
    compute cost: what a probe times is the exchange of those gradients.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros_like(p)) for p in module.parameters() if p.requires_grad
        )

    def forward(self) -> torch.Tensor:
        return torch.stack([(w.float() * w.float()).sum() for w in self.weights]).sum()


def probe_bucket_sizes(
    module: torch.nn.Module,
    device: torch.device,
    optimizations: OptimizationsConfig,
    candidates: Sequence[float],
    *,
    steps: int = PROBE_STEPS,
    warmup: int = WARMUP_STEPS,
) -> dict[float, list[float]]:
    """Each size's step times in seconds, the slowest rank's, identical on every rank
    (a collective: every rank of the trial calls it with the same arguments)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    measured = torch.zeros(len(candidates), steps, dtype=torch.float64)
    for index, size in enumerate(candidates):
        stand_in = _GradientStandIn(module)
        ddp = DistributedDataParallel(
            stand_in,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=size,
        )
        register_comm_hook(ddp, optimizations.gradient_compression, optimizations.powersgd_rank)
        for step in range(warmup + steps):
            sync()
            start = time.perf_counter()
            ddp().backward()
            sync()
            if step >= warmup:
                measured[index, step - warmup] = time.perf_counter() - start
            stand_in.zero_grad(set_to_none=True)
        # Its reducer's hooks go with it: nothing of the probe stays on the parameters.
        del ddp, stand_in
    reduced = measured.to(device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    rows = reduced.cpu().tolist()
    return {float(size): rows[i] for i, size in enumerate(candidates)}


def tune_tensor_fusion(
    module: torch.nn.Module,
    device: torch.device,
    optimizations: OptimizationsConfig,
    recorder: Recorder,
    *,
    world_size: int,
    is_chief: bool,
) -> float:
    """The bucket size (MB) to wrap ``module`` with: the search's earlier choice for this
    shape and world size, else the fastest of :func:`candidate_buckets` (collective)."""
    key = shape_key(module, optimizations)
    known = broadcast_object(recorder.fusion_choice(key, world_size))
    if known is not None:
        if is_chief:
            print(
                f"slotsweep: tensor fusion: {known:g} MB, chosen earlier in this search for "
                f"this model shape and world size {world_size}",
                file=sys.stderr,
                flush=True,
            )
        return float(known)
    step_times = probe_bucket_sizes(
        module, device, optimizations, candidate_buckets(optimizations.tensor_fusion_threshold)
    )
    choice = fastest_bucket(step_times)
    windows: list[TimingWindow] = [
        summarize(timing_name(size), times, 0, 0) for size, times in step_times.items()
    ]
    parameters, gradient_bytes = exchanged(module)
    recorder.record_fusion_choice(
        key,
        world_size,
        choice,
        windows,
        parameters=parameters,
        gradient_bytes=gradient_bytes,
    )
    if is_chief:
        tried = ", ".join(
            f"{size:g} MB {statistics.median(times) * 1e3:.2f} ms"
            for size, times in step_times.items()
        )
        print(
            f"slotsweep: tensor fusion: median step {tried}; using {choice:g} MB",
            file=sys.stderr,
            flush=True,
        )
    return choice
