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


class PhaseProfiler:
    """Laps of the loop's phases on sampled batches, fed into :class:`WindowedTimings`.

    ``sync`` (``torch.cuda.synchronize`` on a GPU) runs before each clock read, but only
    on sampled batches. An inactive profiler (profiling off, or not rank 0) does nothing.
    """

    def __init__(
        self,
        timings: WindowedTimings | None,
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
        return self.timings is not None

    def begin_batch(self) -> None:
        if self.timings is None:
            return
        self._sampled = self._batch_index % self.sample_every == 0
        self._batch_index += 1
        if self._sampled:
            if self._sync is not None:
                self._sync()
            self._last = self._clock()

    def lap(self, name: str) -> None:
        """Record the time since the previous lap (or batch start) as phase ``name``."""
        if not self._sampled or self.timings is None:
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
        if self.timings is None:
            return []
        return self.timings.end_batch(step)

    def flush(self, step: int) -> list[TimingWindow]:
        if self.timings is None:
            return []
        return self.timings.flush(step)
