"""Profiling of the training loop's phases, recorded as windowed aggregates.

A row per batch would flood the database, so each phase's durations are kept for a
window of ``window_batches`` batches and summarised as count, mean, p50, p95 and total.
On a GPU, kernels run asynchronously and an honest duration needs a CUDA
synchronisation, which itself slows training; only every ``sync_every``-th batch is
therefore timed there. On a CPU every batch is timed (a clock read costs ~100 ns).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

PHASES = (
    "dataloader_next",
    "to_device",
    "train_batch",
    "step_lr_schedulers",
    "from_device",
    "reduce_metrics",
)


@dataclass(frozen=True)
class TimingWindow:
    """One phase's durations over the batches ``start_step + 1 .. end_step``."""

    name: str
    start_step: int
    end_step: int
    count: int
    mean_s: float
    p50_s: float
    p95_s: float
    total_s: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation, as numpy's default.

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def summarize(name: str, samples: Sequence[float], start_step: int, end_step: int) -> TimingWindow:
    """The aggregate row of one phase over one window.

    Example:
        >>> summarize("train_batch", [0.1, 0.3, 0.2], 0, 3).p50_s
        0.2
    """
    ordered = sorted(samples)
    total = math.fsum(ordered)
    return TimingWindow(
        name=name,
        start_step=start_step,
        end_step=end_step,
        count=len(ordered),
        mean_s=total / len(ordered),
        p50_s=percentile(ordered, 50),
        p95_s=percentile(ordered, 95),
        total_s=total,
    )


class WindowedTimings:
    """Durations per phase, cut into windows of ``window_batches`` batches.

    Example:
        >>> timings = WindowedTimings(window_batches=2)
        >>> timings.add("train_batch", 0.5)
        >>> timings.end_batch(step=1)
        []
        >>> timings.add("train_batch", 0.7)
        >>> [w.mean_s for w in timings.end_batch(step=2)]
        [0.6]
    """

    def __init__(self, window_batches: int, start_step: int = 0) -> None:
        if window_batches < 1:
            raise ValueError(f"window_batches must be at least 1, got {window_batches}")
        self.window_batches = window_batches
        self._samples: dict[str, list[float]] = {}
        self._window_start = start_step
        self._batches = 0

    def add(self, name: str, seconds: float) -> None:
        samples = self._samples.get(name)
        if samples is None:
            self._samples[name] = [seconds]
        else:
            samples.append(seconds)

    def end_batch(self, step: int) -> list[TimingWindow]:
        """Close one batch; the window's aggregates once it is full, else nothing."""
        self._batches += 1
        if self._batches < self.window_batches:
            return []
        return self.flush(step)

    def flush(self, step: int) -> list[TimingWindow]:
        """Aggregates of whatever the current window holds, and start a new window."""
        windows = [
            summarize(name, samples, self._window_start, step)
            for name, samples in self._samples.items()
            if samples
        ]
        self._samples = {}
        self._window_start = step
        self._batches = 0
        return windows


class Profiler(Protocol):
    """What the training loop calls around its phases, on every batch."""

    @property
    def active(self) -> bool:
        """Whether laps are timed at all."""
        ...

    def begin_batch(self) -> None: ...

    def lap(self, name: str) -> None:
        """Record the time since the previous lap (or batch start) as phase ``name``."""
        ...

    def skip(self) -> None:
        """Restart the lap clock without recording (around work that is not a phase)."""
        ...

    def end_batch(self, step: int) -> list[TimingWindow]:
        """Close one batch; the finished windows' aggregates, if a window is full."""
        ...

    def flush(self, step: int) -> list[TimingWindow]:
        """The current window's aggregates; the next window starts at ``step``."""
        ...


class PhaseProfiler:
    """Laps of the loop's phases on sampled batches, fed into :class:`WindowedTimings`.

    ``sync`` (``torch.cuda.synchronize`` on a GPU) runs before each clock read, but only
    on sampled batches. A rank that does not profile (profiling off, or not rank 0)
    holds :data:`NO_PROFILER` instead.
    """

    def __init__(
        self,
        timings: WindowedTimings,
        *,
        sample_every: int = 1,
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.timings = timings
        self.sample_every = max(1, sample_every)
        self._sync = sync
        self._clock = clock
        self._sampled = False
        self._last = 0.0
        self._batch_index = 0

    @property
    def active(self) -> bool:
        return True

    def begin_batch(self) -> None:
        self._sampled = self._batch_index % self.sample_every == 0
        self._batch_index += 1
        if self._sampled:
            if self._sync is not None:
                self._sync()
            self._last = self._clock()

    def lap(self, name: str) -> None:
        """Record the time since the previous lap (or batch start) as phase ``name``."""
        if not self._sampled:
            return
        if self._sync is not None:
            self._sync()
        now = self._clock()
        self.timings.add(name, now - self._last)
        self._last = now

    def skip(self) -> None:
        """Restart the lap clock without recording (around work that is not a phase)."""
        if self._sampled:
            self._last = self._clock()

    def end_batch(self, step: int) -> list[TimingWindow]:
        return self.timings.end_batch(step)

    def flush(self, step: int) -> list[TimingWindow]:
        return self.timings.flush(step)


class NoProfiler:
    """The profiler of a rank that times nothing: profiling off, or not rank 0.

    No clock read and no synchronisation: each call returns at once.
    """

    @property
    def active(self) -> bool:
        return False

    def begin_batch(self) -> None:
        """Nothing: no batch is sampled."""

    def lap(self, name: str) -> None:
        """Nothing: no batch is sampled."""

    def skip(self) -> None:
        """Nothing: no clock runs."""

    def end_batch(self, step: int) -> list[TimingWindow]:
        return []

    def flush(self, step: int) -> list[TimingWindow]:
        return []


NO_PROFILER = NoProfiler()
