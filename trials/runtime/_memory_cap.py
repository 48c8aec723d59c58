"""A share trial's GPU memory cap, and the one line that says a trial went over it.

A trial on a share of one GPU (``resources.slots_per_trial`` 0.5, 0.25, 0.125: its node's
:data:`~trials.launch.shares.SHARE_ENV_VAR`) shares the GPU with other trials. Its rank
caps its own memory at its share (``torch.cuda.set_per_process_memory_fraction``) as
soon as it has its device, so a trial that needs more than its share fails itself,
with an out-of-memory error of its own, instead of taking memory a neighbour needs and
failing it without a word. That error is then turned into one line naming the cap and
the share (:class:`ShareMemoryExceeded`), which the failure record, the driver's line
and ``slotsweep describe`` show.

Without a share, or on the CPU, nothing is capped: :data:`NO_MEMORY_CAP` stands in.

Example (the line for a simulated out-of-memory error of a quarter of an 80 GiB GPU):
    >>> cap = MemoryCap(share=0.25, gpu="3", total_bytes=80 * 2**30)
    >>> oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ...")
    >>> print(cap.explain(oom))
    CUDA out of memory above this trial's memory cap of 20 GiB: its share 1/4 of GPU 3 (80 GiB), resources.slots_per_trial 0.25 (it tried to allocate 2.00 GiB more); give the trial a larger share or make it use less memory
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from trials.config import format_share
from trials.launch.launcher import SLOTS_ENV_VAR
from trials.launch.shares import share_from_environment

_GIB = 2**30
_TRIED = re.compile(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)")


class ShareMemoryExceeded(RuntimeError):
    """The trial needed more GPU memory than its share of the GPU allows."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is CUDA's out-of-memory error (torch's own, or its message).

    Example:
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 1 GiB"))
        True
        >>> is_out_of_memory(ValueError("bad shape"))
        False
    """
    return isinstance(error, torch.OutOfMemoryError) or "CUDA out of memory" in str(error)


@dataclass(frozen=True)
class MemoryCap:
    """The cap on this process's GPU memory: ``share`` of GPU ``gpu``'s ``total_bytes``."""

    share: float
    #: The GPU as the slot ledger names it (the slot id), for the message.
    gpu: str
    total_bytes: int

    @property
    def cap_bytes(self) -> int:
        return int(self.total_bytes * self.share)

    def message(self, oom_message: str = "") -> str:
        """The one line for a trial that went over the cap (``oom_message``: torch's)."""
        tried = _TRIED.search(oom_message)
        more = f" (it tried to allocate {tried.group(1)} more)" if tried else ""
        return (
            f"CUDA out of memory above this trial's memory cap of "
            f"{_gib(self.cap_bytes)}: its share {format_share(self.share)} of GPU {self.gpu} "
            f"({_gib(self.total_bytes)}), resources.slots_per_trial {self.share:g}{more}; "
            "give the trial a larger share or make it use less memory"
        )

    def explain(self, error: BaseException) -> BaseException:
        """``error`` as the one line naming the cap when it is an out-of-memory error."""
        if not is_out_of_memory(error):
            return error
        lines = str(error).strip().splitlines()
        return ShareMemoryExceeded(self.message(lines[0] if lines else ""))


class NoMemoryCap:
    """The stand-in of a process on whole slots or on the CPU: nothing capped, nothing to say."""

    def explain(self, error: BaseException) -> BaseException:
        return error


NO_MEMORY_CAP = NoMemoryCap()

# This process's cap, once its device is known (one rank per process).
_applied: MemoryCap | NoMemoryCap = NO_MEMORY_CAP


def apply_memory_cap(device: torch.device, local_rank: int = 0) -> MemoryCap | NoMemoryCap:
    """Cap this process's memory on ``device`` at its share, if it runs on one; the cap.

    Called where the rank takes its device (:func:`~trials.runtime._distributed.select_device`);
    calling it again (a warm job's next trial) sets the same cap.
    """
    global _applied
    share = share_from_environment()
    if device.type != "cuda" or share >= 1.0:
        _applied = NO_MEMORY_CAP
        return _applied
    torch.cuda.set_per_process_memory_fraction(share, device)
    slots = os.environ.get(SLOTS_ENV_VAR, "").split(",")
    gpu = slots[local_rank] if local_rank < len(slots) and slots[local_rank] else str(device)
    _applied = MemoryCap(share, gpu, torch.cuda.get_device_properties(device).total_memory)
    return _applied


def explain_memory_error(error: BaseException) -> BaseException:
    """``error`` as this process's cap explains it (unchanged without a cap or an OOM)."""
    return _applied.explain(error)


def _gib(size: int) -> str:
    return f"{size / _GIB:.3g} GiB"
