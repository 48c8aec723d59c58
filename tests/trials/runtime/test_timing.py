from __future__ import annotations

import itertools

import pytest

from trials.runtime._timing import (
    NO_PROFILER,
    PHASES,
    PhaseProfiler,
    WindowedTimings,
    percentile,
    summarize,
)


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
    profiler = PhaseProfiler(WindowedTimings(2), clock=lambda: float(next(ticks)))
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


def test_profiler_syncs_and_times_only_sampled_batches() -> None:
    syncs = []
    ticks = itertools.count()
    profiler = PhaseProfiler(
        WindowedTimings(10),
        sample_every=3,
        sync=lambda: syncs.append(1),
        clock=lambda: float(next(ticks)),
    )
    for step in range(1, 7):
        profiler.begin_batch()
        profiler.lap("train_batch")
        profiler.end_batch(step)
    (window,) = profiler.flush(6)
    assert window.count == 2  # batches 1 and 4 of 6
    assert len(syncs) == 4  # one before the batch, one per lap, on sampled batches only


def test_inactive_profiler_records_nothing() -> None:
    profiler = NO_PROFILER
    profiler.begin_batch()
    profiler.lap("train_batch")
    assert not profiler.active
    assert profiler.end_batch(1) == [] and profiler.flush(1) == []
