"""The UI's SQL: paging, sorting, downsampling and aggregation happen in the database."""

from __future__ import annotations

import statistics

import pytest
import sqlalchemy as sa

from storage import MetricKind, get_engine, record_metrics, session_scope
from tests._demo_data import DemoSearch
from tests.conftest import add_experiment
from tests.real_search import RealSearch
from trials import queries as _queries


@pytest.fixture
def engine(synthetic_search: DemoSearch) -> sa.Engine:
    return get_engine(synthetic_search.url, read_only=True)


def test_list_experiments_pages_and_filters(engine: sa.Engine) -> None:
    everything = _queries.list_experiments(engine)
    assert everything.total == 2
    first = _queries.list_experiments(engine, limit=1, offset=0)
    second = _queries.list_experiments(engine, limit=1, offset=1)
    assert first.total == second.total == 2
    assert [*first.rows["name"], *second.rows["name"]] == list(everything.rows["name"])
    assert list(_queries.list_experiments(engine, states=["COMPLETED"]).rows["name"]) == [
        "regression-cost"
    ]
    # LIKE wildcards in the user's text are literal.
    assert _queries.list_experiments(engine, name_contains="%").total == 0
    assert _queries.list_experiments(engine, name_contains="regression_").total == 0


def test_list_trials_refuses_unknown_sort_columns(
    engine: sa.Engine, synthetic_search: DemoSearch
) -> None:
    with pytest.raises(ValueError, match="sort_by: must be one of number, metric"):
        _queries.list_trials(engine, synthetic_search.experiment_id, sort_by="id; DROP TABLE x")


def test_list_trials_pages(engine: sa.Engine, synthetic_search: DemoSearch) -> None:
    page = _queries.list_trials(
        engine, synthetic_search.experiment_id, sort_by="number", limit=3, offset=3
    )
    assert page.total == 8
    assert list(page.rows["number"]) == [3, 4, 5]


def test_metric_curves_are_downsampled_in_sql(db_url: str) -> None:
    (trial_id,) = add_experiment(db_url, name="bare")[1]
    with session_scope(db_url) as session:
        for step in range(1, 1001):
            record_metrics(session, trial_id, step, MetricKind.TRAINING, {"loss": float(step)})
    engine = get_engine(db_url, read_only=True)
    curves = _queries.metric_curves(
        engine, trial_id, MetricKind.TRAINING, ["loss"], max_points=100
    )
    assert len(curves) == 100
    # Each bucket is the mean of 10 consecutive steps, labelled by its first step.
    assert curves["step"].iloc[0] == 1
    assert curves["value"].iloc[0] == pytest.approx(statistics.fmean(range(1, 11)))
    full = _queries.metric_curves(engine, trial_id, MetricKind.TRAINING, ["loss"], max_points=5000)
    assert len(full) == 1000
    assert _queries.metric_curves(engine, trial_id, MetricKind.VALIDATION, ["loss"]).empty


def test_timing_breakdown_weights_windows_by_batch_count(db_url: str) -> None:
    from storage import Timing

    (trial_id,) = add_experiment(db_url, name="bare")[1]
    with session_scope(db_url) as session:
        for start, count, mean in ((0, 10, 1.0), (10, 30, 3.0)):
            session.add(
                Timing(
                    trial_id=trial_id,
                    name="train_batch",
                    start_step=start,
                    end_step=start + count,
                    count=count,
                    mean_s=mean,
                    p50_s=mean,
                    p95_s=mean * 2,
                    total_s=mean * count,
                )
            )
    breakdown = _queries.timing_breakdown(get_engine(db_url, read_only=True), trial_id)
    row = breakdown.set_index("phase").loc["train_batch"]
    assert row["batches"] == 40
    assert row["mean_s"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert row["p95_s"] == pytest.approx(6.0)
    assert row["share"] == pytest.approx(1.0)


def _assert_snapshot_equals_optunas_read(url: str, study_name: str) -> None:
    import optuna

    from storage import optuna_storage
    from ui import _plots

    stored = optuna.load_study(study_name=study_name, storage=optuna_storage(url))
    copy = _plots.snapshot_study(url, study_name)
    assert copy.directions == stored.directions
    assert copy.metric_names == stored.metric_names
    expected = stored.get_trials(deepcopy=False)
    got = copy.get_trials(deepcopy=False)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert (mine.number, mine.state, mine.values) == (
            theirs.number,
            theirs.state,
            theirs.values,
        )
        assert mine.params == theirs.params
        assert mine.distributions == theirs.distributions
        assert mine.intermediate_values == theirs.intermediate_values


def test_lean_study_snapshot_equals_optunas_own_read(synthetic_search: DemoSearch) -> None:
    for experiment_name in ("regression-demo", "regression-cost"):
        with get_engine(synthetic_search.url).connect() as conn:
            study_name = conn.execute(
                sa.text("SELECT study_name FROM slotsweep_experiments WHERE name = :n"),
                {"n": experiment_name},
            ).scalar_one()
        _assert_snapshot_equals_optunas_read(synthetic_search.url, study_name)


@pytest.mark.slow
def test_lean_study_snapshot_of_the_real_search(real_search: RealSearch) -> None:
    # The study the driver created and the runtime's rank 0 reported into.
    _assert_snapshot_equals_optunas_read(real_search.url, real_search.study_name)
    _assert_snapshot_equals_optunas_read(real_search.running_url, real_search.study_name)
