"""The plain helpers behind the analysis views: units, ASHA rungs, the diff, the state shown."""

from __future__ import annotations

import pandas as pd
import pytest

from storage import get_engine
from tests._demo_data import DemoSearch
from trials import queries as _queries
from trials.config import SearcherConfig
from ui import _charts, _compare, _curves, _units


@pytest.mark.parametrize(
    ("name", "raw", "label", "shown"),
    [
        ("net_recv_bytes_s", 11070004.8753, "MB/s", 11.0700048753),
        ("disk_write_bytes_s", 2_000_000.0, "MB/s", 2.0),
        ("memory_used_gb", 2**30 / 1e9, "GiB", 1.0),
        ("gpu_memory_free_gb", 8 * 2**30 / 1e9, "GiB", 8.0),
        ("cpu_util_percent", 42.0, "%", 42.0),
        ("disk_iops", 12.0, "ops/s", 12.0),
        ("something_new", 3.0, "", 3.0),
    ],
)
def test_system_metric_units(name: str, raw: float, label: str, shown: float) -> None:
    unit = _units.system_unit(name)
    assert unit.label == label
    assert raw * unit.scale == pytest.approx(shown)


def test_axis_titles_name_the_unit() -> None:
    assert _units.titled("net_recv_bytes_s", _units.system_unit("net_recv_bytes_s")) == (
        "net recv (MB/s)"
    )
    assert _units.titled("memory_used_gb", _units.Unit("GiB")) == "memory used (GiB)"
    assert _units.titled("something_new", _units.Unit("")) == "something new"


@pytest.mark.parametrize(
    ("searcher", "axis", "rungs"),
    [
        (
            {"max_length": {"epochs": 30}, "pruner": {"name": "asha", "min_resource": 1}},
            "epoch",
            [1.0, 3.0, 9.0, 27.0],
        ),
        (
            {
                "max_length": {"batches": 1000},
                "pruner": {
                    "name": "asha",
                    "min_resource": 10,
                    "reduction_factor": 4,
                    "min_early_stopping_rate": 1,
                },
            },
            "step",
            [40.0, 160.0, 640.0],
        ),
        # A rung at max_length decides nothing: training ends there anyway.
        ({"max_length": {"epochs": 9}, "pruner": {"name": "asha"}}, "epoch", [1.0, 3.0]),
        ({"max_length": {"epochs": 9}, "pruner": {"name": "median"}}, "epoch", []),
        ({"max_length": {"epochs": 9}}, "epoch", []),
    ],
)
def test_asha_rungs_in_the_axis_unit(
    searcher: dict[str, object], axis: str, rungs: list[float]
) -> None:
    config = SearcherConfig.model_validate({"metric": "loss", "max_trials": 4, **searcher})
    assert _curves.curve_axis(config) == axis
    assert _curves.asha_rungs(config) == rungs


def test_an_unreadable_config_draws_against_batches_without_rungs() -> None:
    assert _curves.curve_axis(None) == "step"
    assert _curves.asha_rungs(None) == []


def test_an_unreadable_stored_config_shows_what_it_can() -> None:
    assert _queries.typed_config({"searcher": {"metric": "x"}}) is None
    assert _queries.metric_name(None) == "metric"
    assert _queries.smaller_is_better(None) is True  # the searcher's default direction


def test_hparam_diff_puts_differing_values_first() -> None:
    trials = pd.DataFrame(
        {
            "number": [4, 1, 7],
            "hp.batch": [64, 64, 64],
            "hp.lr": [0.1, 0.01, 0.1],
            "hp.optimizer": ["sgd", "sgd", None],  # one trial lacks it: that differs too
            "hp.act": ["relu", "relu", "relu"],
        }
    )
    diff = _compare.hparam_diff(trials)
    assert list(diff.columns) == ["hyperparameter", "differs", "#4", "#1", "#7"]
    assert diff.values.tolist() == [
        ["lr", True, "0.1", "0.01", "0.1"],
        ["optimizer", True, "sgd", "sgd", "—"],
        ["act", False, "relu", "relu", "relu"],
        ["batch", False, "64", "64", "64"],
    ]


def test_an_experiment_whose_every_trial_failed_is_shown_as_error() -> None:
    counts = {"COMPLETED": 0, "ERROR": 8, "PRUNED": 0}
    assert _queries.shown_state("COMPLETED", counts) == "ERROR"
    assert _queries.shown_state("COMPLETED", {**counts, "COMPLETED": 1}) == "COMPLETED"
    assert _queries.shown_state("ACTIVE", counts) == "ACTIVE"  # still running: not decided
    assert _queries.shown_state("COMPLETED", {"COMPLETED": 0, "ERROR": 0}) == "COMPLETED"


def test_learning_curve_chart_draws_rungs_only_when_there_are_some() -> None:
    with_rungs = _charts.learning_curve_spec(x="epoch", x_title="epoch", y_title="v", rungs=[1.0])
    marks = [layer["mark"]["type"] for layer in with_rungs["layer"]]
    assert marks == ["rule", "line", "line", "point"]
    plain = _charts.learning_curve_spec(
        x="step", x_title="batch", y_title="v", rungs=[], selectable=False
    )
    assert [layer["mark"]["type"] for layer in plain["layer"]] == ["line", "line", "point"]
    assert "params" not in plain["layer"][0]


def test_learning_curves_of_the_synthetic_search(synthetic_search: DemoSearch) -> None:
    engine = get_engine(synthetic_search.url, read_only=True)
    curves = _queries.learning_curves(
        engine, synthetic_search.experiment_id, "val_loss", smaller_is_better=True
    )
    points = curves.points
    assert curves.kind == "validation" and curves.stride == 1
    pruned = points[points["state"] == "PRUNED"]
    assert not pruned.empty
    # One cross per pruned trial, at its last step.
    crosses = points[points["stopped"]]
    assert sorted(crosses["number"]) == sorted(set(pruned["number"]))
    last = pruned.groupby("number")["step"].max()
    assert all(last[row.number] == row.step for row in crosses.itertuples())
    assert points.loc[points["best"], "number"].nunique() == 1


def test_plots_of_a_line_per_trial_sample_large_studies() -> None:
    import optuna
    from optuna.distributions import FloatDistribution

    from ui import _plots

    study = optuna.create_study()
    n = 2 * _plots.LINE_TRIALS + 500
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={"x": i / n},
                distributions={"x": FloatDistribution(0, 1)},
                value=abs(i - 1234) / n,  # trial 1234 is the best
                intermediate_values={1: 1.0, 2: 0.5},
            )
            for i in range(n)
        ]
    )
    figure, _ = _plots.make_plot(study, _plots.INTERMEDIATE, ["val_loss"])
    assert figure is not None
    names = [trace.name for trace in figure.data]
    # One trial in 3 (2,500 / 1,000 rounded up), plus the best, under their own numbers.
    assert names == [f"Trial{i}" for i in sorted({*range(0, n, 3), 1234})]
    assert _plots.plot_caption(study, _plots.INTERMEDIATE) == (
        "Lines of one trial in 3 by number (plus the best) of 2,500: more lines would "
        "only cover each other."
    )
    parallel, _ = _plots.make_plot(study, _plots.PARALLEL, ["val_loss"])
    assert parallel is not None and len(parallel.data) <= _plots.LINE_TRIALS + 2
