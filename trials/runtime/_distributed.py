"""Where this rank sits in the job, and the few collectives the runtime needs.

``torchrun`` describes the job through environment variables; :class:`DistributedInfo`
reads them once. Every collective helper here is a no-op for a single rank, so the
same loop runs with or without a process group (unit tests call it in-process).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trials.runtime._accelerator import Accelerator
from trials.runtime._memory_cap import apply_memory_cap


@dataclass(frozen=True)
class DistributedInfo:
    """Rank, local rank and sizes of this process, as ``torchrun`` set them.

    ``cross_rank`` is the node's rank (torchrun's ``GROUP_RANK``); with c10d rendezvous
    it follows arrival order, not ``--node_rank``.

    Example:
        >>> info = DistributedInfo.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
        >>> info.rank, info.world_size, info.is_chief
        (1, 2, False)
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    cross_rank: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistributedInfo:
        env = os.environ if env is None else env
        world_size = int(env.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=world_size,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world_size))),
            cross_rank=int(env.get("GROUP_RANK", "0")),
        )

    @property
    def is_chief(self) -> bool:
        """Rank 0: the only rank that writes to the database and the checkpoint store."""
        return self.rank == 0

    @property
    def is_local_chief(self) -> bool:
        """Local rank 0: one per node (runs the node's system-metrics sampler)."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def select_device(info: DistributedInfo) -> torch.device:
    """``cuda:LOCAL_RANK`` when the driver gave this node GPUs, else the CPU.

    On a share of one GPU, the rank's memory is capped at its share from here on
    (:func:`~trials.runtime._memory_cap.apply_memory_cap`).
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        apply_memory_cap(device, info.local_rank)
        return device
    return torch.device("cpu")


def init_process_group(info: DistributedInfo, device: torch.device) -> bool:
    """Join torchrun's job: NCCL on GPUs, gloo on CPUs; whether a group was created.

    Nothing to do for one rank, or when the caller already joined (then the caller
    also leaves).
    """
    if not info.distributed or dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "rank": info.rank, "world_size": info.world_size}
    if device.type == "cuda":
        # Binding the device lets NCCL set up its communicator eagerly and avoids a guess.
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return True


# The process groups this process left, kept until it ends (see destroy_process_group).
_LEFT_GROUPS: list[Any] = []


def destroy_process_group() -> None:
    """Leave the job cleanly, so no peer is left waiting on this rank.

    The group is left but never destroyed: it is kept until the process ends, which a
    rank does without the interpreter's teardown
    (:func:`trials.node.exiting.exit_without_teardown`). torch's gloo group joins its
    worker threads in its destructor, holding the GIL, and a worker still releasing a
    finished collective's tensors waits for the GIL: the rank deadlocks. Seen on rank 1
    right after a trial's last checkpoint gathered the ranks' RNG states: its main
    thread in ``~ProcessGroupGloo`` (DDP's reducer, freed with the trial, held the
    last reference), the worker in ``~AsyncGatherWork`` taking the GIL (gdb).
    """
    if dist.is_available() and dist.is_initialized():
        _LEFT_GROUPS.append(dist.group.WORLD)
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank of the job gets here (nothing to do for one rank)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over every rank, in place; returned for chaining."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_flag(flag: bool, accelerator: Accelerator) -> bool:
    """Rank 0's ``flag`` on every rank (the prune decision, for instance).

    The flag reaches the device without a blocking copy; reading the answer back is the
    one wait for the device.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    tensor = on_device([1.0 if flag else 0.0], accelerator.device)
    dist.broadcast(tensor, src=0)
    return accelerator.to_host(tensor)[0] > 0.5


def on_device(values: list[float], device: torch.device) -> torch.Tensor:
    """A float64 tensor of ``values`` on ``device``, copied without blocking.

    ``torch.tensor(values, device=cuda)`` waits for every kernel queued on the stream
    before it copies; built on the host and moved with ``non_blocking`` it does not.

    Example:
        >>> on_device([1.0, 2.0], torch.device("cpu"))
        tensor([1., 2.], dtype=torch.float64)
    """
    return torch.tensor(values, dtype=torch.float64).to(device, non_blocking=True)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's picklable ``obj`` on every rank (a checkpoint's uuid, for instance)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_to_chief(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (``None`` elsewhere)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    rank = dist.get_rank()
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered
