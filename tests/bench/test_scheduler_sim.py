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


def test_experiments_share_the_pool_without_priority_inversions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--experiments", "6", "--agents", "16", "--trials", "1500", "--latency-queue", "200"]
    assert scheduler_sim.main([*argv, "--seed", "3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"utilization=([\d.]+) inversions=(\d+) backfill_exceptions=(\d+) jain=([\d.]+) "
        r"p50_ms=([\d.]+) p99_ms=([\d.]+) queue=(\d+)",
        last,
    )
    assert match, last
    utilization, jain = float(match.group(1)), float(match.group(4))
    assert 0 < utilization <= 1 and 0 < jain <= 1
    assert int(match.group(2)) == 0  # never a lower priority ahead of a higher one that fits
    assert int(match.group(7)) >= 200  # latency measured with at least that many queued


def test_experiments_span_a_500x_range_of_trial_counts() -> None:
    experiments = scheduler_sim.make_experiments(8, 40_000, mean_length_s=3600, sigma=0.8, seed=0)
    priorities = sorted({x.priority for x in experiments})
    assert priorities == [1, 10, 42]
    counts = [len(x.trials) for x in experiments if x.priority == 42]
    assert max(counts) / min(counts) == pytest.approx(500, rel=0.05)
    ids = [t.trial_id for x in experiments for t in x.trials]
    assert len(ids) == len(set(ids))


def test_shares_packed_against_whole_slots_print_consistent_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert scheduler_sim.main(["--shares", "--agents", "8", "--trials", "600", "--seed", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(
        r"packed_work=([\d.]+) whole_work=([\d.]+) work_ratio=([\d.]+) wait_ratio=([\d.]+) "
        r"throughput_ratio=([\d.]+) p99_ms=([\d.]+)",
        out[-1],
    )
    assert match, out[-1]
    packed, whole, ratio = (float(match.group(i)) for i in (1, 2, 3))
    assert 0 < whole <= 1 and 0 < packed <= 1
    assert ratio == pytest.approx(packed / whole, abs=2e-3)
    assert "mean wait in minutes by slots_per_trial: 0.125:" in "\n".join(out)


def test_a_share_workload_has_every_size_and_whole_slots_hold_shares_whole() -> None:
    pool = scheduler_sim.make_pool(4, 4)
    trials = scheduler_sim.make_share_workload(
        800, pool.total_slots, load=1.2, mean_length_s=600, seed=1, size_weights=(1,) * 7
    )
    assert {t.size for t in trials} == set(scheduler_sim.SHARE_SIZES)
    packed = scheduler_sim.simulate_shares(pool, trials, packed=True)
    whole = scheduler_sim.simulate_shares(pool, trials, packed=False)
    # Packed, a slot's claims are its trials' work; whole, share trials claim whole slots.
    assert packed.claimed == pytest.approx(packed.work)
    assert whole.claimed > whole.work
    assert (
        sum(map(len, packed.waits_s.values()))
        == len(trials)
        == sum(map(len, whole.waits_s.values()))
    )
