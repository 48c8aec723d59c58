"""The scheduler simulation on a small cluster: it runs, and its figures are consistent."""

from __future__ import annotations

import re

import pytest
import scheduler_sim


def test_small_simulation_prints_consistent_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_sim.main(["--agents", "16", "--trials", "400", "--seed", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(
        r"utilization=([\d.]+) fifo_utilization=([\d.]+) ratio=([\d.]+) "
        r"p50_ms=([\d.]+) p99_ms=([\d.]+)",
        out[-1],
    )
    assert last, out[-1]
    ours, fifo, ratio = (float(last.group(i)) for i in (1, 2, 3))
    assert 0 < ours <= 1 and 0 < fifo <= 1
    assert ratio == pytest.approx(ours / fifo, abs=2e-3)
    ceiling = float(out[-2].rsplit("=", 1)[1])
    assert ratio <= ceiling + 1e-3  # utilization cannot exceed 1


def test_workload_follows_the_size_weights() -> None:
    trials = scheduler_sim.make_workload(
        2000,
        capacity_slots=128,
        load=1.5,
        mean_length_s=600,
        seed=0,
        experiment_size=10,
        size_weights=(1, 0, 0, 0, 0, 1),
    )
    assert len(trials) == 2000
    assert {t.slots for t in trials} == {1, 32}
    assert all(t.duration_s > 0 for t in trials)
    assert [t.arrival_s for t in trials] == sorted(t.arrival_s for t in trials)
