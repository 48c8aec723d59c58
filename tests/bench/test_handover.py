"""The hand-over benchmark's arithmetic on hand-written moments (no search is run)."""

from __future__ import annotations

import datetime as dt

import pytest
from handover import PHASES, RANK_0_PHASES, HandOver, percentile, report


def test_a_hand_over_is_split_into_phases_that_add_up_to_it() -> None:
    t0 = dt.datetime(2026, 1, 1)
    moments = [t0 + dt.timedelta(milliseconds=ms) for ms in (0, 30, 50, 60, 130)]
    handover = HandOver(*moments)
    assert handover.total_s == pytest.approx(0.13)
    assert handover.phases_s() == pytest.approx((0.03, 0.02, 0.01, 0.07))
    assert len(PHASES) == len(handover.phases_s())
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    last = report([handover, handover]).splitlines()[-1]
    assert last == "handover_median_s=0.130 handover_p95_s=0.130 handovers=2"


def test_a_hand_over_rank_0_started_itself_is_split_into_its_own_phases() -> None:
    # Rank 0 wrote the next run (10 ms) before the driver recorded the hand-back (40 ms).
    t0 = dt.datetime(2026, 1, 1)
    moments = [t0 + dt.timedelta(milliseconds=ms) for ms in (0, 40, 10, 12, 30)]
    handover = HandOver(*moments)
    assert handover.by_rank_0
    assert handover.phases_s() == pytest.approx((0.012, 0.018))
    assert len(RANK_0_PHASES) == len(handover.phases_s())
    lines = report([handover]).splitlines()
    assert lines[0].endswith("1 started by rank 0 (decided ahead), 0 by the driver")
    assert lines[-1] == "handover_median_s=0.030 handover_p95_s=0.030 handovers=1"
