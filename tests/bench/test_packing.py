"""The packing benchmark's configs and report, on hand-made arms (no search is run)."""

from __future__ import annotations

import pytest
from packing import Arm, packing_config, report

from tests.conftest import EXAMPLES_DIR
from trials.config import parse_config


def test_both_arms_search_the_same_trials_and_differ_in_the_share_only() -> None:
    whole = packing_config(1, trials=8, concurrent=4, epochs=2, seed=3)
    shares = packing_config(0.25, trials=8, concurrent=4, epochs=2, seed=3)
    assert whole["resources"]["slots_per_trial"] == 1
    assert shares["resources"]["slots_per_trial"] == 0.25
    differing = {key for key in whole if whole[key] != shares[key]}
    assert differing == {"name", "resources"}
    config = parse_config(shares, config_dir=EXAMPLES_DIR / "digits")
    assert config.resources.slot_share == 0.25 and config.resources.slots == 1
    assert config.searcher.name == "random" and config.searcher.seed == 3


def test_the_report_prints_the_ratios_last() -> None:
    whole = Arm("whole", trials=16, wall_s=400.0, best=0.2, best_at_s=300.0, completed=16)
    shares = Arm("shares", trials=16, wall_s=100.0, best=0.2, best_at_s=80.0, completed=16)
    lines = report(whole, shares, share=0.25, device="cuda")
    assert whole.per_hour == pytest.approx(144.0)
    assert lines[-1] == (
        "trials_per_hour_ratio=4.000 time_to_best_ratio=3.750 trials=16 share=0.25 device=cuda"
    )
    assert "4.00x the trials per hour" in lines[-2]
