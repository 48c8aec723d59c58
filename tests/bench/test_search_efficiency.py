"""What the search-efficiency benchmark counts, on a database written by hand."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from search_efficiency import (
    EXAMPLE,
    bootstrap_interval,
    compute_to_target,
    load_results,
    search_config,
)
from sqlalchemy import update

from storage import (
    ExperimentState,
    Metric,
    MetricKind,
    TrialState,
    record_metrics,
    session_scope,
    upgrade_schema,
)
from tests.conftest import add_experiment

T0 = dt.datetime(2026, 1, 1)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _search(url: str) -> None:
    """Trial 1 (2 slots) validates epochs 1-3 at 10/20/30 s; trial 2 reaches 0.99 at 25 s."""
    _, trial_ids = add_experiment(
        url,
        [
            {
                "state": TrialState.COMPLETED,
                "slots_per_trial": slots,
                "started_at": _at(start),
                "ended_at": _at(end),
            }
            for slots, start, end in [(2, 0.0, 35.0), (1, 5.0, 40.0)]
        ],
        state=ExperimentState.COMPLETED,
    )
    curves = [[(10, 0.5), (20, 0.9), (30, 0.995)], [(15, 0.8), (25, 0.99), (35, 0.5)]]
    for trial_id, points in zip(trial_ids, curves, strict=True):
        for epoch, (seconds, accuracy) in enumerate(points, start=1):
            with session_scope(url) as session:
                record_metrics(
                    session,
                    trial_id,
                    epoch * 10,
                    MetricKind.VALIDATION,
                    {"val_accuracy": accuracy},
                    epoch=float(epoch),
                )
                # Recorded when the search would have recorded it.
                session.execute(
                    update(Metric)
                    .where(Metric.trial_id == trial_id, Metric.step == epoch * 10)
                    .values(recorded_at=_at(seconds))
                )


def test_compute_is_counted_up_to_the_first_hit(db_url: str) -> None:
    _search(db_url)
    reach = compute_to_target(db_url, 0.99)
    assert reach.reached and reach.hit_trial == 2 and reach.hit_epoch == 2.0
    assert reach.hit_accuracy == pytest.approx(0.99)
    # By 25 s trial 1 had validated 2 epochs and trial 2 had validated 2.
    assert reach.epochs == 4.0
    assert reach.trials_started == 2
    assert reach.slot_seconds == pytest.approx(2 * 25.0 + 1 * 20.0)


def test_a_target_never_reached_counts_everything(db_url: str) -> None:
    _search(db_url)
    reach = compute_to_target(db_url, 0.999)
    assert not reach.reached and reach.hit_trial is None
    assert reach.epochs == 6.0
    assert reach.slot_seconds == pytest.approx(2 * 35.0 + 1 * 35.0)


def test_kept_searches_are_summarised_from_their_databases(tmp_path: Path) -> None:
    for part, arm in [("part1", "random"), ("part2", "tpe_asha")]:
        folder = tmp_path / part / f"{arm}-seed3"
        folder.mkdir(parents=True)
        url = f"sqlite:///{folder / 'search.db'}"
        upgrade_schema(url)
        _search(url)
    (tmp_path / "part1" / "not-a-search").mkdir()

    results = load_results([tmp_path / "part1", tmp_path / "part2"], 0.99)

    assert sorted(results) == ["random", "tpe_asha"]
    for arm, runs in results.items():
        assert [(r.arm, r.seed, r.wall_s) for r in runs] == [(arm, 3, None)]
        assert runs[0].reach.epochs == 4.0


def test_a_seed_kept_twice_is_refused(tmp_path: Path) -> None:
    for part in ("part1", "part2"):
        folder = tmp_path / part / "random-seed0"
        folder.mkdir(parents=True)
        upgrade_schema(f"sqlite:///{folder / 'search.db'}")
    with pytest.raises(SystemExit, match="random seed 0 appears twice"):
        load_results([tmp_path / "part1", tmp_path / "part2"], 0.99)


def test_bootstrap_interval_brackets_the_ratio_of_medians() -> None:
    pairs = [(400.0, 100.0), (600.0, 150.0), (50.0, 48.0), (900.0, 200.0), (300.0, 330.0)]
    low, high = bootstrap_interval(pairs)
    ratio = 150.0 / 400.0  # median of b over median of a
    assert low <= ratio <= high
    assert 48.0 / 900.0 <= low < high <= 330.0 / 50.0
    # Seeded: the same seeds give the same interval.
    assert bootstrap_interval(pairs) == (low, high)
    assert bootstrap_interval([(100.0, 30.0)] * 4) == pytest.approx((0.3, 0.3))


def test_the_arms_differ_only_in_searcher_and_pruner(tmp_path: Path) -> None:
    example = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    arms = {
        arm: search_config(arm, 4, max_trials=150, epochs=27, folder=tmp_path)
        for arm in ("random", "tpe_asha")
    }
    for config in arms.values():
        assert config["hyperparameters"] == example["hyperparameters"]
        # Both searchers optimise the quantity the target is about.
        assert config["searcher"]["metric"] == "val_accuracy"
        assert config["searcher"]["smaller_is_better"] is False
    random_arm, tpe_arm = (dict(arms[arm]["searcher"]) for arm in ("random", "tpe_asha"))
    assert (random_arm.pop("name"), random_arm.pop("pruner")) == ("random", {"name": "none"})
    assert (tpe_arm.pop("name"), tpe_arm.pop("pruner")["name"]) == ("tpe", "asha")
    assert random_arm == tpe_arm
    random_rest, tpe_rest = (
        {k: v for k, v in arms[arm].items() if k not in ("name", "searcher")}
        for arm in ("random", "tpe_asha")
    )
    assert random_rest == tpe_rest
