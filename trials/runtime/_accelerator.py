"""The device a rank trains on, as the managed loop meets it outside the model.

Besides running the user's model, the loop touches the device in three ways: it moves
batches there, it marks the phases of a batch on the device's timeline, and it copies
a report's metrics back to the host. Only the last waits for the device, once per
report. Those three go through one object chosen per rank by :func:`accelerator_for`
(Lightning's ``Accelerator`` in spirit): on a CPU nothing is asynchronous, so a batch
stays where it is and the phase clock is the host's; on CUDA a batch is copied without
blocking, phases are CUDA events recorded on the current stream
(:class:`CudaEventClock`), and :meth:`Accelerator.to_host` is the loop's one
device-to-host wait. A test hands the runner a recording stand-in to count the waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Protocol, cast

import torch

from trials.runtime._timing import HOST_CLOCK, PhaseClock


class Accelerator(Protocol):
    """What the managed loop and the context do with this rank's device."""

    @property
    def device(self) -> torch.device:
        """The torch device tensors go to."""
        ...

    def to_device(self, data: Any) -> Any:
        """``data`` (tensors in lists, tuples, named tuples and dicts) on the device,
        without waiting for the copy."""
        ...

    def to_host(self, tensor: torch.Tensor) -> list[float]:
        """A one-dimensional tensor's values on the host: waits for the device."""
        ...

    def phase_clock(self) -> PhaseClock:
        """The clock of the loop's phase timings."""
        ...

    def timed_every(self, sync_every: int) -> int:
        """Of every how many batches the profiler times one (``profiling.sync_every``)."""
        ...


def move_to(data: Any, device: torch.device) -> Any:
    """``data`` with every tensor in it copied to ``device`` without blocking.

    Example:
        >>> move_to({"x": [torch.zeros(2)], "n": 3}, torch.device("cpu"))
        {'x': [tensor([0., 0.])], 'n': 3}
    """
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: move_to(v, device) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(move_to(v, device) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(move_to(v, device) for v in data)
    return data


class CpuAccelerator:
    """A rank on the CPU: batches are already there, the host's clock times every batch.

    Example:
        >>> cpu = CpuAccelerator()
        >>> cpu.to_host(torch.tensor([1.0, 2.0])), cpu.timed_every(10)
        ([1.0, 2.0], 1)
    """

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def to_device(self, data: Any) -> Any:
        return data

    def to_host(self, tensor: torch.Tensor) -> list[float]:
        return cast("list[float]", tensor.tolist())

    def phase_clock(self) -> PhaseClock:
        return HOST_CLOCK

    def timed_every(self, sync_every: int) -> int:
        # A clock read costs ~100 ns and waits for nothing: every batch is timed.
        return 1


class CudaEventClock:
    """Marks as CUDA events recorded on the current stream; never waits until :meth:`wait`.

    Events are reused once the profiler has read them (creating one is a driver call).
    """

    def __init__(self) -> None:
        self._free: list[torch.cuda.Event] = []

    def mark(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: torch.cuda.Event) -> bool:
        return bool(mark.query())

    def wait(self, mark: torch.cuda.Event) -> None:
        mark.synchronize()

    def read(self, marks: Sequence[torch.cuda.Event]) -> list[float]:
        seconds = [float(start.elapsed_time(end)) / 1000.0 for start, end in pairwise(marks)]
        self._free.extend(marks)
        return seconds


class CudaAccelerator:
    """A rank on one CUDA device (``select_device`` made it the current one)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    @property
    def device(self) -> torch.device:
        return self._device

    def to_device(self, data: Any) -> Any:
        return move_to(data, self._device)

    def to_host(self, tensor: torch.Tensor) -> list[float]:
        return cast("list[float]", tensor.tolist())

    def phase_clock(self) -> PhaseClock:
        return CudaEventClock()

    def timed_every(self, sync_every: int) -> int:
        # Recording an event costs a few microseconds of the host: a sample is enough.
        return sync_every


def accelerator_for(device: torch.device) -> Accelerator:
    """The accelerator of a rank on ``device`` (``cpu`` or ``cuda``).

    Example:
        >>> accelerator_for(torch.device("cpu")).device
        device(type='cpu')
    """
    if device.type == "cuda":
        return CudaAccelerator(device)
    if device.type == "cpu":
        return CpuAccelerator()
    raise ValueError(f"no accelerator for a {device.type} device (cpu or cuda)")
