"""What the search-efficiency benchmark counts, on a database written by hand."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from search_efficiency import (
    EXAMPLE,
    Reach,
    SearchResult,
    bootstrap_interval,
    compute_to_target,
    load_results,
    print_summary,
    search_config,
)
from sqlalchemy import update

from searcher import parse_config
from storage import (
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    TrialRun,
    TrialState,
    WarmJob,
    record_metrics,
    session_scope,
    upgrade_schema,
)
from tests.conftest import REPO_ROOT, add_experiment, cli_environment

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


def _warm_search(url: str) -> None:
    """Trials 1 (0-10 s) and 2 (12-30 s, 0.99 at 25 s) on one warm job of 1 slot held
    from 0 to 40 s, and trial 3 (2 slots, 5-20 s) on no job."""
    experiment_id, trial_ids = add_experiment(
        url,
        [
            {
                "state": TrialState.COMPLETED,
                "slots_per_trial": slots,
                "started_at": _at(start),
                "ended_at": _at(end),
            }
            for slots, start, end in [(1, 0.0, 10.0), (1, 12.0, 30.0), (2, 5.0, 20.0)]
        ],
        state=ExperimentState.COMPLETED,
    )
    with session_scope(url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.config = {"resources": {"slots_per_trial": 1, "reuse_workers": True}}
        session.add(
            WarmJob(
                experiment_id=experiment_id,
                resource_pool="default",
                slots=1,
                placement=[],
                launch_token="job",
                started_at=_at(0.0),
                ended_at=_at(40.0),
            )
        )
        for trial_id, token, (start, end) in zip(
            trial_ids,
            ["job", "job", "cold"],
            [(0.0, 10.0), (12.0, 30.0), (5.0, 20.0)],
            strict=True,
        ):
            session.add(
                TrialRun(
                    trial_id=trial_id,
                    attempt=0,
                    started_at=_at(start),
                    ended_at=_at(end),
                    launch_token=token,
                )
            )
    for trial_id, seconds, accuracy in [(trial_ids[0], 8.0, 0.5), (trial_ids[1], 25.0, 0.99)]:
        with session_scope(url) as session:
            record_metrics(
                session, trial_id, 10, MetricKind.VALIDATION, {"val_accuracy": accuracy}, epoch=1.0
            )
            session.execute(
                update(Metric).where(Metric.trial_id == trial_id).values(recorded_at=_at(seconds))
            )


def test_warm_slot_seconds_count_what_the_jobs_held(db_url: str) -> None:
    _warm_search(db_url)
    reach = compute_to_target(db_url, 0.99)
    assert reach.reached and reach.hit_trial is not None
    # To the hit at 25 s: the job held its slot 25 s (its idle gap 10-12 s included);
    # trial 3 ran on no job and counts its own span, 2 x 15.
    assert reach.slot_seconds == pytest.approx(25.0 + 30.0)
    # The trials' spans alone leave the job's idle gap out: 10 + 13 + 30.
    assert reach.trial_slot_seconds == pytest.approx(10.0 + 13.0 + 30.0)
    # Start-ups: the job's, to its first trial's first metric (8 s), and trial 3's, which
    # recorded nothing, its whole span (2 x 15).
    assert reach.startup_slot_seconds == pytest.approx(8.0 + 30.0)
    # Never reached: the job's whole time (to its end at 40 s) and trial 3's.
    assert compute_to_target(db_url, 0.999).slot_seconds == pytest.approx(40.0 + 30.0)


def test_warm_runs_both_arms_with_reuse_workers(tmp_path: Path) -> None:
    for arm in ("random", "tpe_asha"):
        cold = search_config(arm, 4, max_trials=150, epochs=27, folder=tmp_path)
        warm = search_config(arm, 4, max_trials=150, epochs=27, folder=tmp_path, warm=True)
        assert parse_config(warm).resources.reuse_workers is True
        assert parse_config(cold).resources.reuse_workers is False
        # Nothing else differs between the modes (the name tells them apart).
        assert warm["name"] == cold["name"] + "-warm"
        differ = {key for key in cold if cold[key] != warm[key]}
        assert differ == {"name", "resources"}
        assert {**warm["resources"], "reuse_workers": False} == {
            **cold["resources"],
            "reuse_workers": False,
        }


def test_kept_warm_searches_are_read_only_as_warm(tmp_path: Path) -> None:
    for name, warm in [("random-warm-seed1", True), ("random-seed1", False)]:
        folder = tmp_path / name
        folder.mkdir()
        url = f"sqlite:///{folder / 'search.db'}"
        upgrade_schema(url)
        if warm:
            _warm_search(url)
        else:
            _search(url)

    warm_results = load_results([tmp_path], 0.99, warm=True)
    cold_results = load_results([tmp_path], 0.99)

    assert [(r.seed, r.warm) for r in warm_results["random"]] == [(1, True)]
    assert warm_results["random"][0].reach.slot_seconds == pytest.approx(55.0)
    assert [(r.seed, r.warm) for r in cold_results["random"]] == [(1, False)]
    # A folder whose name says cold but whose search ran warm is refused.
    (tmp_path / "random-warm-seed1").rename(tmp_path / "random-seed2")
    with pytest.raises(SystemExit, match="with warm workers"):
        load_results([tmp_path], 0.99)


def test_the_summary_says_which_mode_ran(capsys: pytest.CaptureFixture[str]) -> None:
    def result(arm: str, seed: int, epochs: float, warm: bool) -> SearchResult:
        reach = Reach(True, epochs, 10 * epochs, 3, 1, 1.0, 0.99, 9 * epochs)
        return SearchResult(arm, seed, reach, 1.0, warm)

    for warm in (False, True):
        results = {
            "random": [result("random", s, 30.0, warm) for s in (0, 1)],
            "tpe_asha": [result("tpe_asha", s, 9.0, warm) for s in (0, 1)],
        }
        print_summary(results, warm=warm)
        lines = capsys.readouterr().out.strip().splitlines()
        assert lines[0].startswith("mode: warm" if warm else "mode: cold")
        assert lines[-1] == "random_compute=30.0 tpe_asha_compute=9.0 ratio=0.300"
        assert "slot-seconds: random 300.0 tpe_asha 90.0 ratio 0.300" in lines
        spans = [line for line in lines if line.startswith("slot-seconds of the trials")]
        assert len(spans) == (1 if warm else 0)


@pytest.mark.slow
def test_a_tiny_warm_search_runs_and_says_so(tmp_path: Path) -> None:
    env = cli_environment()
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "search_efficiency.py"),
            "--warm",
            "--seeds",
            "0",
            "--target",
            "0.5",
            "--epochs",
            "3",
            "--max-trials",
            "4",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    lines = result.stdout.strip().splitlines()
    assert any(line.startswith("mode: warm") for line in lines), result.stdout
    searches = [line for line in lines if line.startswith("seed 0 ")]
    assert len(searches) == 2 and all(" warm: reached " in line for line in searches), searches
    assert lines[-1].startswith("random_compute="), lines[-1]
