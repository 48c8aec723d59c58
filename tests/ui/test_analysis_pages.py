"""Analysing a search (issue 17) on the databases of real ``slotsweep run`` searches.

Learning curves, the extra Optuna plots, Compare, human units, the slot grid and a
search whose every trial failed, each read back against what the real driver, torchrun
and the runtime recorded (``tests/real_search.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests.real_search import (
    AGENT,
    AGENT_SLOTS,
    FAILING_TRIALS,
    FAILURE_MESSAGE,
    MAX_TRIALS,
    RealSearch,
)
from tests.ui._pages import PageRenderer, assert_no_exception, texts, vega_charts
from trials import queries as _queries
from ui import _format

pytestmark = pytest.mark.slow

METRIC = "val_loss"


def _rows(url: str, sql: str, **params: Any) -> list[sa.Row[Any]]:
    with get_engine(url).connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def _trials(search: RealSearch) -> list[sa.Row[Any]]:
    return _rows(
        search.url,
        "SELECT * FROM slotsweep_trials WHERE experiment_id = :e ORDER BY optuna_trial_number",
        e=search.experiment_id,
    )


# --- Learning curves ----------------------------------------------------------------------


def test_learning_curves_show_every_trial_and_where_pruned_ones_stopped(
    render: PageRenderer, real_search: RealSearch
) -> None:
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    assert_no_exception(app)
    trials = _trials(real_search)
    (spec, points), *_ = vega_charts(app)
    assert set(points["number"]) == {t.optuna_trial_number for t in trials}
    # Each curve is the trial's recorded validation values, epoch by epoch.
    for trial in trials:
        recorded = _rows(
            real_search.url,
            "SELECT epoch, value FROM slotsweep_metrics WHERE trial_id = :t"
            " AND kind = 'VALIDATION' AND name = :m ORDER BY step",
            t=trial.id,
            m=METRIC,
        )
        curve = points[points["number"] == trial.optuna_trial_number]
        assert list(curve["epoch"]) == [r.epoch for r in recorded]
        assert list(curve["value"]) == pytest.approx([r.value for r in recorded])
        # A pruned trial ends in a cross at its last recorded epoch; no other point does.
        stopped = curve[curve["stopped"]]
        if trial.state == "PRUNED":
            assert list(stopped["epoch"]) == [recorded[-1].epoch]
        else:
            assert stopped.empty
    assert any(t.state == "PRUNED" for t in trials), "ASHA pruned nothing: nothing to check"
    best = min(
        (t for t in trials if t.state == "COMPLETED"), key=lambda t: t.searcher_metric_value
    )
    assert set(points.loc[points["best"], "number"]) == {best.optuna_trial_number}
    # ASHA (min_resource 1, reduction_factor 3) over 2 epochs has one rung, at epoch 1.
    rungs = [layer for layer in spec["layer"] if layer["mark"]["type"] == "rule"]
    assert [v["rung"] for v in rungs[0]["data"]["values"]] == [1.0]
    assert spec["layer"][1]["encoding"]["x"]["title"] == "epoch"
    shown = texts(app)
    assert f"`{METRIC}` (validation metric) against the epoch for all {MAX_TRIALS} trials" in shown
    assert f"Best: trial {best.optuna_trial_number} (black)" in shown
    assert "dashed lines: ASHA rungs at 1." in shown


def test_learning_curves_sample_large_searches_in_sql(real_search: RealSearch) -> None:
    engine = get_engine(real_search.url, read_only=True)
    curves = _queries.learning_curves(
        engine, real_search.experiment_id, METRIC, smaller_is_better=True, max_trials=2
    )
    # Every 2nd trial by number, plus the best (trial 0 here, which stride 2 keeps).
    assert curves.stride == 2 and curves.trials_total == MAX_TRIALS
    assert set(curves.points["number"]) == {0, 2} | {curves.best_number}
    one_point = _queries.learning_curves(
        engine, real_search.experiment_id, METRIC, smaller_is_better=True, max_points=1
    )
    # One bucket of steps per trial: the mean of its values, at its last step.
    assert one_point.points.groupby("number").size().max() == 1


# --- The header and the plots -------------------------------------------------------------


def test_every_hyperparameter_column_is_in_the_trials_table(
    render: PageRenderer, real_search: RealSearch
) -> None:
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    hparams = json.loads(_trials(real_search)[0].hparams)
    summary = _queries.experiment_summary(
        get_engine(real_search.url, read_only=True), real_search.experiment_id
    )
    assert summary is not None and summary.config is not None
    constant = {k for k, hp in summary.config.hyperparameters.items() if hp.type == "const"}
    # The searched hyperparameters first, the constant ones after (issue 33 item 4).
    expected = [f"hp.{k}" for k in sorted(hparams) if k not in constant]
    expected += [f"hp.{k}" for k in sorted(hparams) if k in constant]
    assert constant and expected[-1].removeprefix("hp.") in constant
    for table in app.dataframe[:2]:
        order = list(table.proto.column_order)
        assert [c for c in order if c.startswith("hp.")] == expected
        config = json.loads(table.proto.columns)
        assert all(config[f"hp.{k}"]["label"] == k for k in hparams)
        assert config["number"]["pinned"] is True  # the trial stays in view while scrolling


def test_headline_numbers_are_four_significant_digits(
    render: PageRenderer, real_search: RealSearch
) -> None:
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    metrics = {m.label: m.value for m in app.metric}
    best = min(t.searcher_metric_value for t in _trials(real_search) if t.state == "COMPLETED")
    assert metrics[f"Best {METRIC}"] == f"{best:.4g}"
    assert len(metrics[f"Best {METRIC}"].replace(".", "").lstrip("0")) <= 4


# --- A search whose every trial failed ----------------------------------------------------


def test_a_failed_trial_shows_the_first_failing_ranks_traceback(
    render: PageRenderer, failed_search: RealSearch
) -> None:
    (trial, *_) = _rows(failed_search.url, "SELECT id FROM slotsweep_trials ORDER BY id")
    app = render("trial", failed_search.url, trial=trial.id)
    assert_no_exception(app)
    (expander,) = (e for e in app.expander if e.label.startswith("Traceback of rank"))
    assert f"FileNotFoundError: {FAILURE_MESSAGE}" in expander.label
    (code,) = expander.code
    assert "__init__" in code.value and "FileNotFoundError" in code.value


def test_all_failed_experiment_is_shown_failed_with_its_reason(
    render: PageRenderer, failed_search: RealSearch
) -> None:
    app = render("experiment", failed_search.url, experiment=failed_search.experiment_id)
    assert_no_exception(app)
    errors = _rows(failed_search.url, "SELECT error FROM slotsweep_trials")
    reason = errors[0].error
    assert reason and all(e.error == reason for e in errors)
    assert app.subheader[0].value.endswith(":red-badge[ERROR]")
    assert {m.label: m.value for m in app.metric}["State"] == "ERROR"
    (message,) = (e.value for e in app.error)
    assert message.startswith(
        f"All {FAILING_TRIALS} finished trials failed. Commonest reason "
        f"({FAILING_TRIALS} of {FAILING_TRIALS}): **{reason}**"
    )
    # The exception the trials raised: in the recorded reason, or else from the traceback
    # a rank recorded or the trial's log.
    shown = "\n".join([message, *(str(c.value) for c in app.code)])
    assert f"FileNotFoundError: {FAILURE_MESSAGE}" in shown
    assert f"No trial completed: all {FAILING_TRIALS} failed." in texts(app)
    assert "No trial has completed" not in texts(app)
    assert (
        f"No trial completed ({FAILING_TRIALS} failed, 0 pruned of {FAILING_TRIALS}), "
        "so there is nothing to draw the Optimization history from." in texts(app)
    )

    listing = render("experiments", failed_search.url)
    row = listing.dataframe[0].value.set_index("name").loc[failed_search.name]
    assert (row["state"], row["failed"], row["completed"]) == ("ERROR", FAILING_TRIALS, 0)


# --- Compare ------------------------------------------------------------------------------


def test_compare_trials_puts_differing_hyperparameters_first(
    render: PageRenderer, real_search: RealSearch
) -> None:
    trials = _trials(real_search)
    ids = ",".join(str(t.id) for t in trials)
    app = render("compare", real_search.url, trials=ids)
    assert_no_exception(app)
    assert app.title[0].value == "Compare"
    diff = app.dataframe[0].value
    hparams = [json.loads(t.hparams) for t in trials]
    differing = sorted(k for k in hparams[0] if len({str(h[k]) for h in hparams}) > 1)
    same = sorted(k for k in hparams[0] if k not in differing)
    assert list(diff["hyperparameter"]) == differing + same
    assert list(diff["differs"]) == [True] * len(differing) + [False] * len(same)
    for trial, params in zip(trials, hparams, strict=True):
        column = diff[f"#{trial.optuna_trial_number}"]
        assert list(column) == [_format.number(params[k]) for k in differing + same]
    assert f"{len(differing)} of {len(hparams[0])} hyperparameters differ" in texts(app)
    # Training and validation curves overlaid: one line per trial in each chart.
    charts = {spec["encoding"]["y"]["title"]: data for spec, data in vega_charts(app)}
    assert {"loss", "lr", "val_loss", "val_accuracy"} <= set(charts)
    labels = {f"#{t.optuna_trial_number}" for t in trials}
    assert set(charts["val_loss"]["trial"]) == labels
    assert set(charts["loss"]["trial"]) == labels


def test_compare_needs_two_trials(render: PageRenderer, real_search: RealSearch) -> None:
    app = render("compare", real_search.url, trials=str(_trials(real_search)[0].id))
    assert_no_exception(app)
    assert "Pick 2 to 5 trials" in texts(app)


def test_best_so_far_follows_the_real_search(real_search: RealSearch) -> None:
    engine = get_engine(real_search.url, read_only=True)
    every = _queries.best_so_far(engine, real_search.experiment_id, smaller_is_better=True)
    # Every ended trial has a row (the chart's x runs to the last trial), in the order
    # they ended; the improving ones are flagged.
    assert list(every["trials"]) == list(range(1, len(_trials(real_search)) + 1))
    best = every[every["improved"]]
    ended = sorted(_trials(real_search), key=lambda t: (t.ended_at, t.id))
    expected, running, used = [], None, 0.0
    for position, trial in enumerate(ended, start=1):
        used += trial.slot_seconds
        value = trial.searcher_metric_value if trial.state == "COMPLETED" else None
        if value is not None and (running is None or value < running):
            running = value
            expected.append((trial.optuna_trial_number, position, used, value))
    got = list(
        zip(best["number"], best["trials"], best["slot_seconds"], best["best"], strict=True)
    )
    assert [g[:2] for g in got] == [e[:2] for e in expected] and expected
    assert [g[2:] for g in got] == [pytest.approx(e[2:]) for e in expected]


# --- Units, clock times, the slot grid ----------------------------------------------------


def test_system_metrics_and_timings_read_in_human_units(
    render: PageRenderer, real_search: RealSearch
) -> None:
    trial = _trials(real_search)[0]
    app = render("trial", real_search.url, trial=trial.id)
    app.selectbox(key=f"sysmetric_{trial.id}").set_value("net_recv_bytes_s").run()
    assert_no_exception(app)
    charts = {spec["encoding"]["y"]["title"]: (spec, data) for spec, data in vega_charts(app)}
    spec, data = charts["net recv (MB/s)"]
    assert spec["encoding"]["x"]["axis"]["format"] == "%H:%M:%S"
    recorded = _rows(
        real_search.url,
        "SELECT value FROM slotsweep_system_metrics WHERE trial_id = :t"
        " AND name = 'net_recv_bytes_s' ORDER BY recorded_at",
        t=trial.id,
    )
    assert list(data["value"]) == pytest.approx([r.value / 1e6 for r in recorded])
    summary = next(t.value for t in app.dataframe if "unit" in t.value.columns)
    units = dict(zip(summary["name"], summary["unit"], strict=True))
    assert units["net_recv_bytes_s"] == "MB/s"
    assert units["memory_used_gb"] == "GiB" and units["cpu_util_percent"] == "%"
    memory = summary.set_index("name").loc["memory_used_gb"]
    raw = _rows(
        real_search.url,
        "SELECT AVG(value) AS v FROM slotsweep_system_metrics WHERE trial_id = :t"
        " AND name = 'memory_used_gb'",
        t=trial.id,
    )[0].v
    assert float(memory["mean"]) == pytest.approx(raw * 1e9 / 2**30)
    # Per-batch phases in milliseconds, on the table and the chart.
    assert "mean per batch (ms)" in charts
    timings = next(t.value for t in app.dataframe if "phase" in t.value.columns)
    means = _rows(
        real_search.url,
        "SELECT name, SUM(mean_s * count) / SUM(count) AS mean FROM slotsweep_timings"
        " WHERE trial_id = :t GROUP BY name",
        t=trial.id,
    )
    shown = dict(zip(timings["phase"], timings["mean_s"], strict=True))
    assert shown == pytest.approx({r.name: r.mean * 1e3 for r in means})


def test_cluster_grid_colours_each_slot_by_its_trial(
    render: PageRenderer,
    real_search: RealSearch,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(real_search.cluster_file))
    app = render("cluster", real_search.running_url)
    assert_no_exception(app)
    (spec, cells), *_ = vega_charts(app)
    held = _rows(
        real_search.running_url,
        "SELECT a.slot, a.experiment_id, t.optuna_trial_number, a.warm_job_id"
        " FROM slotsweep_allocations a JOIN slotsweep_trials t ON t.id = a.trial_id",
    )
    assert len(cells) == AGENT_SLOTS and set(cells["agent"]) == {AGENT}
    by_slot = cells.set_index("slot")
    for row in held:
        label = f"{row.experiment_id}.{row.optuna_trial_number}"
        # With `reuse_workers` the trial runs on a warm job (the copy was taken mid-trial).
        on_job = f" on warm job {row.warm_job_id}" if row.warm_job_id is not None else ""
        assert by_slot.loc[row.slot, "holder"] == f"{real_search.name} · trial {label}{on_job}"
        assert by_slot.loc[row.slot, "label"] == label
    # The CLI names each slot's trial exactly as the page does.
    from searcher.cli import main

    capsys.readouterr()
    argv = ["task", "list", "--json", "--db", real_search.running_url]
    assert main([*argv, "--cluster", str(real_search.cluster_file)]) == 0
    cli_labels = {
        row["slot"]: row["trial"]
        for row in json.loads(capsys.readouterr().out)["slots"]
        if row["trial"]
    }
    assert cli_labels == {
        slot: by_slot.loc[slot, "label"] for slot in by_slot.index if by_slot.loc[slot, "label"]
    }
    free = set(range(AGENT_SLOTS)) - {row.slot for row in held}
    assert held and free and all(by_slot.loc[s, "holder"] == "free" for s in free)
    colour = spec["layer"][0]["encoding"]["color"]["scale"]
    assert colour["domain"][0] == "free" and len(set(colour["range"])) == len(colour["range"])
