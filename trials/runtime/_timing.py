"""Profiling of the training loop's phases, recorded as windowed aggregates.

A row per batch would flood the database, so each phase's durations are kept for a
window of ``window_batches`` batches and summarised as count, mean, p50, p95 and total.

Where the times come from is a :class:`PhaseClock`. On a CPU it is the host's clock and
every batch is timed (a clock read costs ~100 ns). On a GPU, kernels run
asynchronously: a host clock read would time the launches, and waiting for the GPU
before each read (``torch.cuda.synchronize``) stalls its queue and cost 7-11% of every
trial's throughput on an H200. There the marks are CUDA events recorded on the current
stream (``trials.runtime._accelerator``), on every ``sync_every``-th batch; their times
are read once the GPU has passed them (``event.query()``, which never waits), at the
latest at the training-metric report's copy to the host, which waits anyway. DeepSpeed's
timers work the same way. A phase's time is then the stretch of the GPU's timeline
between two marks: the phases of a batch add up to its step time, and host work the GPU
did not wait for (a data loader running ahead) costs nothing, as it costs the trial
nothing.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

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
        self.add_laps((name,), (seconds,))

    def add_laps(self, names: Sequence[str], seconds: Sequence[float]) -> None:
        """One batch's phases: ``names[i]`` took ``seconds[i]``."""
        for name, value in zip(names, seconds, strict=True):
            samples = self._samples.get(name)
            if samples is None:
                self._samples[name] = [value]
            else:
                samples.append(value)

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


class PhaseClock(Protocol):
    """Marks on a timeline and the seconds between two: where phase times come from.

    A mark is opaque to the profiler: a host clock reading, or a CUDA event recorded on
    the stream. Its time may be known only later (:meth:`ready`).
    """

    def mark(self) -> Any:
        """A mark at this point of the timeline."""
        ...

    def ready(self, mark: Any) -> bool:
        """Whether ``mark`` (and every earlier mark) has a time, without waiting for it."""
        ...

    def wait(self, mark: Any) -> None:
        """Block until ``mark`` has a time (only where the profiler must: its flush)."""
        ...

    def read(self, marks: Sequence[Any]) -> list[float]:
        """Seconds between consecutive ``marks`` (the last one ready); the marks are then
        the clock's again (events go back to a pool)."""
        ...


class HostClock:
    """The host's clock: a mark is a reading, ready at once.

    Example:
        >>> ticks = iter([1.0, 1.5, 3.0])
        >>> clock = HostClock(lambda: next(ticks))
        >>> marks = [clock.mark(), clock.mark(), clock.mark()]
        >>> clock.ready(marks[-1]), clock.read(marks)
        (True, [0.5, 1.5])
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        # The clock itself: a mark costs one call, on every batch of a CPU rank.
        self.mark = clock

    def ready(self, mark: float) -> bool:
        return True

    def wait(self, mark: float) -> None:
        """Nothing to wait for: a reading is known when it is taken."""

    def read(self, marks: Sequence[float]) -> list[float]:
        return [end - start for start, end in itertools.pairwise(marks)]


HOST_CLOCK = HostClock()


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

    def end_batch(self, step: int) -> list[TimingWindow]:
        """Close one batch; the aggregates of the windows whose times are all known."""
        ...

    def flush(self, step: int) -> list[TimingWindow]:
        """Every window's aggregates, the current one's included, waiting for their times
        if need be; the next window starts at ``step``."""
        ...


class _ClosedBatch(NamedTuple):
    """A batch whose phase times may not be known yet: its step, phase names and marks
    (one more mark than names: the batch's start). An untimed batch has neither."""

    step: int
    names: Sequence[str] = ()
    marks: Sequence[Any] = ()


class PhaseProfiler:
    """Laps of the loop's phases on sampled batches, fed into :class:`WindowedTimings`.

    Every ``sample_every``-th batch is timed (the first of each group). Closed batches
    wait in order until their clock knows their times; a window's aggregates come out
    once all its batches are known, so a GPU that runs behind the host is never waited
    for, except by :meth:`flush`. A rank that does not profile (profiling off, or not
    rank 0) holds :data:`NO_PROFILER` instead.

    Example:
        >>> ticks = iter(range(100))
        >>> profiler = PhaseProfiler(WindowedTimings(2), clock=HostClock(lambda: next(ticks)))
        >>> for step in (1, 2):
        ...     profiler.begin_batch()
        ...     profiler.lap("dataloader_next")
        ...     profiler.lap("train_batch")
        ...     windows = profiler.end_batch(step)
        >>> [(w.name, w.count, w.total_s) for w in windows]
        [('dataloader_next', 2, 2.0), ('train_batch', 2, 2.0)]
    """

    def __init__(
        self,
        timings: WindowedTimings,
        *,
        sample_every: int = 1,
        clock: PhaseClock = HOST_CLOCK,
    ) -> None:
        self.timings = timings
        self.sample_every = max(1, sample_every)
        self.clock = clock
        self._mark = clock.mark
        self._sampled = False
        self._names: list[str] = []
        self._marks: list[Any] = []
        self._batch_index = 0
        # Closed batches whose times are not known yet, oldest first.
        self._waiting: deque[_ClosedBatch] = deque()

    @property
    def active(self) -> bool:
        return True

    def begin_batch(self) -> None:
        self._sampled = self._batch_index % self.sample_every == 0
        self._batch_index += 1
        if self._sampled:
            # New lists: a closed batch keeps the old ones.
            self._names = []
            self._marks = [self._mark()]

    def lap(self, name: str) -> None:
        """Mark the end of phase ``name``: it ran since the previous lap (or batch start)."""
        if self._sampled:
            self._marks.append(self._mark())
            self._names.append(name)

    def end_batch(self, step: int) -> list[TimingWindow]:
        waiting = self._waiting
        if self._sampled:
            self._sampled = False
            marks = self._marks
            if not waiting and self.clock.ready(marks[-1]):
                # Known at once (the host's clock): no queue.
                self.timings.add_laps(self._names, self.clock.read(marks))
                return self.timings.end_batch(step)
            waiting.append(_ClosedBatch(step, self._names, marks))
        elif not waiting:
            return self.timings.end_batch(step)
        else:
            waiting.append(_ClosedBatch(step))
        return self._take_known()

    def flush(self, step: int) -> list[TimingWindow]:
        timed = [batch for batch in self._waiting if batch.marks]
        if timed and not self.clock.ready(timed[-1].marks[-1]):
            self.clock.wait(timed[-1].marks[-1])
        windows = self._take_known()
        return windows + self.timings.flush(step)

    def _take_known(self) -> list[TimingWindow]:
        """Feed the oldest closed batches whose times are known into the windows."""
        windows: list[TimingWindow] = []
        clock = self.clock
        waiting = self._waiting
        while waiting and (not waiting[0].marks or clock.ready(waiting[0].marks[-1])):
            batch = waiting.popleft()
            if batch.marks:
                self.timings.add_laps(batch.names, clock.read(batch.marks))
            windows += self.timings.end_batch(batch.step)
        return windows


class NoProfiler:
    """The profiler of a rank that times nothing: profiling off, or not rank 0.

    No clock read and no mark: each call returns at once.
    """

    @property
    def active(self) -> bool:
        return False

    def begin_batch(self) -> None:
        """Nothing: no batch is sampled."""

    def lap(self, name: str) -> None:
        """Nothing: no batch is sampled."""

    def end_batch(self, step: int) -> list[TimingWindow]:
        return []

    def flush(self, step: int) -> list[TimingWindow]:
        return []


NO_PROFILER = NoProfiler()
