"""DistributedDataParallel as the optimizations section configures it.

- ``tensor_fusion_threshold`` (MB) is DDP's ``bucket_cap_mb``: gradients are fused into
  buckets of that size before each all-reduce, DDP's counterpart of Horovod's tensor
  fusion.
- ``gradient_compression`` registers one of torch's DDP communication hooks: fp16 or
  bf16 compression (gradients travel at half width and are decompressed after the
  all-reduce) or PowerSGD (low-rank approximation with error feedback).
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations at runtime.
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trials.config import OptimizationsConfig

# PowerSGD runs plain all-reduce for its first iterations (torch requires at least 2
# with error feedback); a short warm-up suits the short trials of a search.
POWERSGD_START_ITER = 2


def wrap_ddp(
    module: torch.nn.Module,
    device: torch.device,
    optimizations: OptimizationsConfig,
    *,
    find_unused_parameters: bool = False,
) -> DistributedDataParallel:
    """``module`` (already on ``device``) wrapped in DDP with the configured buckets and hook."""
    ddp = DistributedDataParallel(
        module,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=optimizations.tensor_fusion_threshold,
        find_unused_parameters=find_unused_parameters,
    )
    register_comm_hook(ddp, optimizations.gradient_compression, optimizations.powersgd_rank)
    return ddp


def _bf16_compress_hook_gloo(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16 compression hook, under a name DDP does not reserve for NCCL.

    DDP refuses ``bf16_compress_hook`` by name unless NCCL is present, although gloo
    all-reduces bfloat16 tensors; the compression itself is torch's own.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def register_comm_hook(
    ddp: DistributedDataParallel, compression: str, powersgd_rank: int = 1
) -> Any:
    """Register the hook for ``compression`` (none, fp16, bf16, powersgd); returns its state.

    A rank calls it on its ``DistributedDataParallel`` model, which needs the trial's
    process group (so no example runs it here)::

        state = register_comm_hook(ddp_model, "fp16")
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if compression == "none":
        return None
    if compression == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if compression == "bf16":
        on_nccl = dist.get_backend() == "nccl"
        ddp.register_comm_hook(
            None, default_hooks.bf16_compress_hook if on_nccl else _bf16_compress_hook_gloo
        )
        return None
    if compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=POWERSGD_START_ITER,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    raise ValueError(
        f"optimizations.gradient_compression: must be none, fp16, bf16 or powersgd, got {compression!r}"
    )
