from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from trials.runtime import CpuAccelerator, PyTorchTrialContext, load_entrypoint
from trials.runtime._distributed import DistributedInfo
from trials.runtime._loop import ManagedLoop
from trials.runtime._outcome import TrialOutcome
from trials.runtime._timing import (
    NO_PROFILER,
    PHASES,
    HostClock,
    PhaseProfiler,
    TimingWindow,
    WindowedTimings,
    percentile,
    summarize,
)

from .conftest import FIXTURES
from .test_context import spec
from .test_standins import CallLog

SINGLE = DistributedInfo()


def test_percentile_matches_numpy_linear_interpolation() -> None:
    import numpy as np

    values = sorted([0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.05])
    for q in (0, 5, 50, 95, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_summarize_gives_count_mean_p50_p95_total() -> None:
    window = summarize("train_batch", [1.0, 2.0, 3.0, 4.0], start_step=10, end_step=14)
    assert (window.name, window.start_step, window.end_step, window.count) == (
        "train_batch",
        10,
        14,
        4,
    )
    assert window.mean_s == 2.5
    assert window.p50_s == 2.5
    assert window.p95_s == pytest.approx(3.85)
    assert window.total_s == 10.0


def test_windows_close_every_window_batches_and_flush_the_rest() -> None:
    timings = WindowedTimings(window_batches=3)
    closed = []
    for step in range(1, 8):
        timings.add("train_batch", float(step))
        if step % 2 == 0:
            timings.add("reduce_metrics", 0.5)
        closed.append(timings.end_batch(step))
    full = [w for batch in closed for w in batch]
    assert [(w.name, w.start_step, w.end_step, w.count) for w in full] == [
        ("train_batch", 0, 3, 3),
        ("reduce_metrics", 0, 3, 1),
        ("train_batch", 3, 6, 3),
        ("reduce_metrics", 3, 6, 2),
    ]
    rest = timings.flush(7)
    assert [(w.name, w.start_step, w.end_step, w.count, w.mean_s) for w in rest] == [
        ("train_batch", 6, 7, 1, 7.0)
    ]
    assert timings.flush(7) == []


def test_profiler_laps_phases_with_an_injected_clock() -> None:
    ticks = itertools.count()
    profiler = PhaseProfiler(WindowedTimings(2), clock=HostClock(lambda: float(next(ticks))))
    for step in (1, 2):
        profiler.begin_batch()
        for phase in PHASES[:3]:
            profiler.lap(phase)
        windows = profiler.end_batch(step)
    assert {w.name: w.total_s for w in windows} == {
        "dataloader_next": 2.0,
        "to_device": 2.0,
        "train_batch": 2.0,
    }


class StreamClock:
    """CUDA events as the profiler meets them, on the host: a mark is known once the
    test's "device" has passed it (``passed``), or after :meth:`wait`, which is counted.

    Marks are ``(sequence number, time)``; times come from the host clock's ticks.
    """

    def __init__(self) -> None:
        self.made = 0
        self.passed = -1  # the sequence number of the last mark the device passed
        self.waits: list[int] = []
        self.released: list[int] = []
        self._ticks = itertools.count()

    def mark(self) -> tuple[int, float]:
        self.made += 1
        return (self.made - 1, float(next(self._ticks)))

    def ready(self, mark: tuple[int, float]) -> bool:
        return mark[0] <= self.passed

    def wait(self, mark: tuple[int, float]) -> None:
        self.waits.append(mark[0])
        self.passed = max(self.passed, mark[0])

    def read(self, marks: Sequence[tuple[int, float]]) -> list[float]:
        assert self.ready(marks[-1]), "read before the device passed it"
        self.released += [mark[0] for mark in marks]
        return [end[1] - start[1] for start, end in itertools.pairwise(marks)]


def run_batches(profiler: PhaseProfiler, steps: range, laps: Sequence[str]) -> list[list[str]]:
    """Each batch's windows, as ``name@start-end/count`` strings."""
    out = []
    for step in steps:
        profiler.begin_batch()
        for name in laps:
            profiler.lap(name)
        out.append(
            [f"{w.name}@{w.start_step}-{w.end_step}/{w.count}" for w in profiler.end_batch(step)]
        )
    return out


def test_a_window_comes_out_once_the_device_passed_its_marks_and_nothing_waits() -> None:
    clock = StreamClock()
    profiler = PhaseProfiler(WindowedTimings(2), sample_every=2, clock=clock)
    laps = ("dataloader_next", "train_batch")
    # The device is behind: nothing is known, so no window comes out, and nobody waits.
    assert run_batches(profiler, range(1, 6), laps) == [[], [], [], [], []]
    assert clock.made == 3 * 3  # batches 1, 3 and 5 of 5: a start and two laps each
    assert clock.waits == [] and clock.released == []
    # It passes batch 3's marks (a report's copy to the host drains the stream).
    clock.passed = 5
    windows = run_batches(profiler, range(6, 7), laps)
    assert windows == [
        [
            "dataloader_next@0-2/1",
            "train_batch@0-2/1",
            "dataloader_next@2-4/1",
            "train_batch@2-4/1",
        ]
    ]
    assert clock.released == list(range(6))  # their events are reused
    # The trial's end waits once, for the last mark, and closes the rest.
    rest = profiler.flush(6)
    assert clock.waits == [8]
    assert [(w.name, w.start_step, w.end_step, w.count, w.total_s) for w in rest] == [
        ("dataloader_next", 4, 6, 1, 1.0),
        ("train_batch", 4, 6, 1, 1.0),
    ]
    assert profiler.flush(6) == [] and clock.waits == [8]


def test_the_phases_of_a_batch_add_up_to_its_span_on_the_clock() -> None:
    clock = StreamClock()
    profiler = PhaseProfiler(WindowedTimings(10), clock=clock)
    run_batches(profiler, range(1, 4), PHASES)
    windows = profiler.flush(3)
    # Each batch: a start mark and one per phase, consecutive ticks: one "second" apiece.
    assert {w.name: (w.count, w.total_s) for w in windows} == {name: (3, 3.0) for name in PHASES}


def test_profiler_times_only_sampled_batches() -> None:
    clock = StreamClock()
    clock.passed = 10**9  # a device that is never behind
    profiler = PhaseProfiler(WindowedTimings(10), sample_every=3, clock=clock)
    run_batches(profiler, range(1, 7), ["train_batch"])
    (window,) = profiler.flush(6)
    assert window.count == 2  # batches 1 and 4 of 6
    assert clock.made == 4 and clock.waits == []


def test_inactive_profiler_records_nothing() -> None:
    profiler = NO_PROFILER
    profiler.begin_batch()
    profiler.lap("train_batch")
    assert not profiler.active
    assert profiler.end_batch(1) == [] and profiler.flush(1) == []


class WindowLog(CallLog):
    """The recorder stand-in that also notes the timing windows it is given."""

    def timings(self, windows: Sequence[TimingWindow]) -> None:
        # One window per phase: the spans they cover.
        spans = sorted({(w.start_step, w.end_step) for w in windows})
        self.calls.append(("timings", tuple(spans)))


def test_finished_windows_are_recorded_with_the_next_training_report(tmp_path: Path) -> None:
    """One transaction of rank 0's recorder per report, not one more per window: the
    windows finished since the last report are handed over right before its metrics."""
    recorder = WindowLog()
    fields: dict[str, Any] = {
        "entrypoint": "timed_trials:ReportingTrial",
        "model_dir": str(FIXTURES),
        "hparams": {"global_batch_size": 8, "train_size": 800},  # 100 batches an epoch
        "slots_per_trial": 1,
        "max_length": {"batches": 250},
        "min_validation_period": {"epochs": 1},
        "checkpoint_storage": {"path": str(tmp_path / "checkpoints")},
    }
    context = PyTorchTrialContext(spec(tmp_path, **fields), SINGLE, CpuAccelerator(), recorder)
    trial = load_entrypoint(fields["entrypoint"], fields["model_dir"])
    assert ManagedLoop(trial, context).run() is TrialOutcome.FINISHED
    sequence = [
        (name, args[0] if name == "training_metrics" else args)
        for name, args in recorder.calls
        if name in ("timings", "training_metrics")
    ]
    # The window that ends at a report closes after it: it waits for the next one.
    assert sequence == [
        ("timings", ((0, 50),)),
        ("training_metrics", 100),
        ("timings", ((50, 100), (100, 150))),
        ("training_metrics", 200),
        ("timings", ((150, 200),)),
        ("training_metrics", 250),
        ("timings", ((200, 250),)),
    ]
