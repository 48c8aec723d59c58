"""``optimizations.auto_tune_tensor_fusion``: the choice (pure) and two real ranks tuning.

The two-rank test runs the digits example three times in one torchrun: tuned, then
with the chosen size fixed, then tuned again (which re-uses the first choice).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage import FusionChoice, Metric, Timing, session_scope, upgrade_schema
from trials.runtime._fusion import candidate_buckets, fastest_bucket, timing_name

from .conftest import FIXTURES, REPO_ROOT, create_trial, run_torchrun


def test_candidates_include_the_configured_threshold_once() -> None:
    assert candidate_buckets(64.0) == [1.0, 4.0, 16.0, 64.0]
    assert candidate_buckets(0.5) == [0.5, 1.0, 4.0, 16.0, 64.0]


def test_fastest_is_the_lowest_median_and_the_smaller_size_on_a_tie() -> None:
    times = {64.0: [0.1, 0.9, 0.9], 4.0: [0.5, 0.5, 0.5], 16.0: [0.2, 0.3, 9.0]}
    assert fastest_bucket(times) == 16.0  # one slow outlier does not decide
    assert fastest_bucket({16.0: [0.2], 4.0: [0.2]}) == 4.0
    with pytest.raises(ValueError):
        fastest_bucket({})


def test_timing_names_fit_the_timing_column() -> None:
    assert timing_name(1.0) == "tensor_fusion_1mb"
    assert len(timing_name(1024.0 * 1024.0)) <= 64


def _metrics(db_url: str, trial_id: int) -> dict[tuple[str, str, int], float | None]:
    with session_scope(db_url) as session:
        rows = session.scalars(select(Metric).where(Metric.trial_id == trial_id))
        return {(row.kind.value, row.name, row.step): row.value for row in rows}


def _fusion_timings(db_url: str, trial_id: int) -> dict[str, float]:
    with session_scope(db_url) as session:
        rows = session.scalars(
            select(Timing).where(Timing.trial_id == trial_id, Timing.name.like("tensor_fusion_%"))
        )
        return {row.name: row.p50_s for row in rows}


@pytest.mark.slow
def test_auto_tune_picks_the_fastest_on_every_rank_and_trains_as_the_fixed_size(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'slotsweep.db'}"
    upgrade_schema(url)
    digits: dict[str, Any] = {
        "study_name": "fusion",
        "entrypoint": "model:DigitsTrial",
        "model_dir": str(REPO_ROOT / "examples" / "digits"),
        "hparams": {"global_batch_size": 64, "lr": 0.1, "optimizer": "sgd"},
        "max_length": {"batches": 12},
        "min_validation_period": {"batches": 6},
        "seed": 3,
    }
    tuned = create_trial(url, tmp_path, optimizations={"auto_tune_tensor_fusion": True}, **digits)
    fixed = create_trial(url, tmp_path, data={"fusion_twin": True}, **digits)
    again = create_trial(url, tmp_path, optimizations={"auto_tune_tensor_fusion": True}, **digits)
    out = tmp_path / "out"
    out.mkdir()
    result = run_torchrun(
        [str(FIXTURES / "fusion_checks.py")],
        env={
            "FUSION_CHECKS_OUT": str(out),
            "FUSION_CHECKS_SPECS": json.dumps([str(h.spec_path) for h in (tuned, fixed, again)]),
        },
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        outcomes = json.loads((out / f"outcomes-rank{rank}.json").read_text())
        assert outcomes == ["finished"] * 3

    # Every rank holds the same (slowest-rank) step times and picks the same size: the
    # one whose median is lowest.
    reports = [json.loads((out / f"tune-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert reports[0] == reports[1]
    medians = {float(size): statistics.median(t) for size, t in reports[0]["times"].items()}
    assert reports[0]["fastest"] == min(medians, key=lambda size: medians[size])
    assert reports[0]["chosen"] in candidate_buckets(0.25)

    # The tuned trial recorded each size's step times and chose the fastest of them.
    probes = _fusion_timings(url, tuned.spec.trial_id)
    assert set(probes) == {timing_name(size) for size in candidate_buckets(64.0)}
    with session_scope(url) as session:
        (choice,) = session.scalars(select(FusionChoice)).all()
        assert choice.trial_id == tuned.spec.trial_id and choice.world_size == 2
        chosen = choice.bucket_mb
    assert timing_name(chosen) == min(probes, key=lambda name: probes[name])

    # Training with the tuned size is training with that size fixed: the same metrics.
    assert _metrics(url, tuned.spec.trial_id) == _metrics(url, fixed.spec.trial_id)
    assert len(_metrics(url, tuned.spec.trial_id)) > 4
    # The same model shape and world size later in the search: re-used, not probed.
    assert _fusion_timings(url, again.spec.trial_id) == {}
    assert "chosen earlier in this search" in result.stderr
