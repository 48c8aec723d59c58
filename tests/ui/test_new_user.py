"""What a new user meets (issue 33): pages opened bare, one trial identity, 4-digit values.

SYNTHETIC data (``synthetic_search``), rendered through AppTest; the layout a real
browser shows is checked in :mod:`tests.ui.test_browser`.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests._demo_data import DemoSearch
from tests.ui._pages import PageRenderer, assert_no_exception, texts, vega_charts
from ui import _actions, _charts, _format


def _number(url: str, trial_id: int) -> tuple[int, int]:
    with get_engine(url, read_only=True).connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT experiment_id, optuna_trial_number FROM slotsweep_trials WHERE id = :i"
            ),
            {"i": trial_id},
        ).one()
    return int(row[0]), int(row[1])


def test_compare_opened_bare_offers_the_pickers(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    # Issue 33 item 1: KeyError 'experiment_id' when opened from the sidebar.
    app = render("compare", synthetic_search.url)
    assert_no_exception(app)
    assert "Pick 2 to 5 trials" in texts(app)


def test_trial_urls_name_experiment_and_number_and_old_ids_redirect(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    experiment, number = _number(synthetic_search.url, synthetic_search.restarted_trial_id)
    ref = f"{experiment}.{number}"
    app = render("trial", synthetic_search.url, trial=ref)
    assert_no_exception(app)
    assert app.subheader[0].value.startswith(f"Trial #{number} of ")
    assert f"Trial {ref} (experiment #{experiment}" in texts(app)
    caption = texts(app)
    assert "Trial id" not in caption and "Optuna trial id" not in caption
    assert f"Optuna trial number {number}, as in the logs" in caption
    # An old link's database id lands on the same trial, under its new address.
    old = render("trial", synthetic_search.url, trial=synthetic_search.restarted_trial_id)
    assert_no_exception(old)
    assert old.query_params["trial"] == ref
    assert old.subheader[0].value == app.subheader[0].value


def test_compare_trials_by_number_and_old_ids_redirect(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    first = _number(synthetic_search.url, synthetic_search.completed_trial_id)
    second = _number(synthetic_search.url, synthetic_search.pruned_trial_id)
    refs = ",".join(f"{e}.{n}" for e, n in sorted([first, second]))
    app = render("compare", synthetic_search.url, trials=refs)
    assert_no_exception(app)
    assert {f"#{first[1]}", f"#{second[1]}"} <= set(app.dataframe[0].value.columns)
    ids = f"{synthetic_search.completed_trial_id},{synthetic_search.pruned_trial_id}"
    old = render("compare", synthetic_search.url, trials=ids)
    assert_no_exception(old)
    assert old.query_params["trials"] == refs


def test_compare_curves_offer_batches_epochs_samples_and_slot_seconds(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    first = _number(synthetic_search.url, synthetic_search.completed_trial_id)
    second = _number(synthetic_search.url, synthetic_search.restarted_trial_id)
    app = render(
        "compare", synthetic_search.url, trials=",".join(f"{e}.{n}" for e, n in [first, second])
    )
    control = app.get("button_group")
    assert any("samples" in str(c.proto) and "slot-seconds" in str(c.proto) for c in control)
    app.session_state["compare_x_axis"] = "samples"
    app.run()
    assert_no_exception(app)
    titles = {spec["encoding"]["x"]["title"] for spec, _ in vega_charts(app)}
    assert titles == {"samples"}


def test_values_keep_four_significant_digits_everywhere(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    # Issue 33 item 2: "0.00002" for 1.67e-05; one format on every page and in the CLI.
    app = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    assert_no_exception(app)
    configs = [json.loads(table.proto.columns or "{}") for table in app.dataframe]
    number_formats = {
        column["type_config"].get("format")
        for config in configs
        for column in config.values()
        if column.get("type_config", {}).get("type") == "number"
        and column["type_config"].get("format")
    }
    assert number_formats == {_format.COLUMN, "#%d"}  # and trial numbers as #N
    # The displayed text is rounded; the table's data (what the grid's CSV download and a
    # double-clicked cell show) is each trial's exact stored value.
    with get_engine(synthetic_search.url, read_only=True).connect() as conn:
        stored = {
            int(number): json.loads(hparams) if isinstance(hparams, str) else hparams
            for number, hparams in conn.execute(
                sa.text(
                    "SELECT optuna_trial_number, hparams FROM slotsweep_trials"
                    " WHERE experiment_id = :e"
                ),
                {"e": synthetic_search.experiment_id},
            )
        }
    tables = [t.value for t in app.dataframe if {"number", "hp.lr"} <= set(t.value.columns)]
    assert tables and all(table["hp.lr"].dtype == float for table in tables)
    shown = {
        int(n): lr
        for table in tables
        for n, lr in zip(table["number"], table["hp.lr"], strict=True)
    }
    assert shown == {n: h["lr"] for n, h in stored.items() if n in shown}
    assert any(_format.number(lr) != repr(lr) for lr in shown.values())
    trial = render("trial", synthetic_search.url, trial=synthetic_search.completed_trial_id)
    hparams = next(t.value for t in trial.dataframe if "exact value" in t.value.columns)
    for shown, exact in zip(hparams["value"], hparams["exact value"], strict=True):
        try:
            value = float(exact)
        except ValueError:
            assert shown == exact
        else:
            assert shown == _format.number(value if "." in exact or "e" in exact else int(exact))


def test_learning_curves_read_under_asha(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    # Issue 33 item 5: a legend of states that do not occur, pruned crosses near
    # ERROR's red, no hyperparameters in the tooltip, linear only, ticks at 0.4 epochs.
    app = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    assert_no_exception(app)
    (spec, points), *_ = vega_charts(app)
    lines = next(layer for layer in spec["layer"] if "detail" in layer.get("encoding", {}))
    legend = lines["encoding"]["color"]["scale"]["domain"]
    assert legend == [s for s in _charts.STATE_COLORS if s in set(points["state"])]
    assert _charts.STATE_COLORS["PRUNED"] != _charts.STATE_COLORS["ERROR"]
    assert "#e" not in _charts.STOPPED_COLOR  # not a red
    assert lines["encoding"]["x"]["axis"]["tickMinStep"] == 1
    assert "hparams" in {t["field"] for t in lines["encoding"]["tooltip"]}
    assert all("lr=" in text for text in points["hparams"])
    assert lines["encoding"]["y"]["scale"] == {"zero": False}
    app.toggle(key=f"curves_log_{synthetic_search.experiment_id}").set_value(True).run()
    (spec, _), *_ = vega_charts(app)
    lines = next(layer for layer in spec["layer"] if "detail" in layer.get("encoding", {}))
    assert lines["encoding"]["y"]["scale"] == {"type": "log"}


def _execute(url: str, sql: str, **params: object) -> None:
    with get_engine(url).begin() as conn:
        conn.execute(sa.text(sql), params)


def test_fail_fast_stop_is_stated_with_its_reason(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    # Issue 33 item 6: "3/4" and a bar, but not why the search stopped.
    experiment = writable_synthetic.experiment_id
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_experiments SET state = 'ERROR' WHERE id = :e",
        e=experiment,
    )
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_trials SET state = 'ERROR', error = 'ValueError: boom'"
        " WHERE experiment_id = :e",
        e=experiment,
    )
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    assert_no_exception(app)
    assert (
        "stopped the experiment early (fail-fast): the first 3 trials all failed with the "
        "same error and none succeeded: ValueError: boom (fail_fast_trials: 3)"
    ) in texts(app)
    # The driver's own words win when it wrote them into a trial it ended.
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_trials SET error = 'experiment stopped: the first 3 trials all"
        " failed with the same error and none succeeded: ValueError: bad'"
        " WHERE experiment_id = :e AND optuna_trial_number = 4",
        e=experiment,
    )
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    assert "none succeeded: ValueError: bad (fail_fast_trials: 3)" in texts(app)


def test_detached_experiment_says_how_to_start_it_and_offers_resume(
    render: PageRenderer, writable_synthetic: DemoSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 33 item 7: "ACTIVE ... no driver recorded" and no way to start it here.
    experiment = writable_synthetic.experiment_id
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_experiments SET driver_pid = NULL, driver_host = NULL,"
        " driver_heartbeat_at = NULL, state = 'ACTIVE' WHERE id = :e",
        e=experiment,
    )
    started: list[tuple[list[str], dict[str, object]]] = []

    class _Process:
        pid = 4242

    def _popen(args: list[str], **kwargs: object) -> _Process:
        started.append((args, kwargs))
        return _Process()

    monkeypatch.setattr(_actions.subprocess, "Popen", _popen)
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    assert_no_exception(app)
    assert f"`slotsweep resume {experiment}`" in texts(app)
    radio = app.radio(key=f"action_{experiment}")
    assert "Resume" in radio.options  # beside Pause and Kill
    radio.set_value(_actions.RESUME).run()
    app.checkbox(key=f"action_confirmed_{experiment}").check().run()
    next(b for b in app.button if b.label == "Send request").click().run()
    assert_no_exception(app)
    ((args, kwargs),) = started
    # An argument list, no shell, its own session; the URL in the environment only.
    assert args[1:] == ["-m", "searcher.cli", "resume", str(experiment), "--no-progress"]
    assert "shell" not in kwargs and kwargs["start_new_session"] is True
    env = kwargs["env"]
    assert isinstance(env, dict) and env["SLOTSWEEP_DB"] == writable_synthetic.url
    assert not any(writable_synthetic.url in a for a in args)
    assert "Started `slotsweep resume" in texts(app)


def test_description_is_shown_on_the_experiment_page(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    experiment = writable_synthetic.experiment_id
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_experiments"
        " SET config = json_set(config, '$.description', 'Digits, ASHA over lr') WHERE id = :e",
        e=experiment,
    )
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    assert_no_exception(app)
    assert "Digits, ASHA over lr" in [m.value for m in app.markdown]


def test_compare_experiments_plots_every_trial_and_lists_failed_searches(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    # Issue 33 item 9: only improving trials were plotted, failed searches dropped
    # without a word, and no summary table.
    demo, cost = writable_synthetic.experiment_id, writable_synthetic.multi_objective_experiment_id
    _execute(
        writable_synthetic.url,
        "UPDATE slotsweep_trials SET state = 'ERROR', searcher_metric_value = NULL"
        " WHERE experiment_id = :e",
        e=cost,
    )
    app = render("compare", writable_synthetic.url, experiments=f"{demo},{cost}")
    assert_no_exception(app)
    summary = next(t.value for t in app.dataframe if "searcher" in t.value.columns)
    assert {"experiment", "trials", "best", "slot_seconds", "searcher"} <= set(summary.columns)
    assert len(summary) == 2
    assert "No completed trial, so no curve: regression-cost" in texts(app)
    with get_engine(writable_synthetic.url, read_only=True).connect() as conn:
        ended = conn.execute(
            sa.text(
                "SELECT state FROM slotsweep_trials WHERE experiment_id = :e"
                " AND ended_at IS NOT NULL ORDER BY ended_at, id"
            ),
            {"e": demo},
        ).all()
    # One point per ended trial from the first completed one on, not only improvers.
    first = next(i for i, (state,) in enumerate(ended) if state == "COMPLETED")
    charts = vega_charts(app)
    assert len(charts) == 2
    for spec, data in charts:
        assert len(data) == len(ended) - first
        assert spec["encoding"]["y"]["axis"]["format"] == _format.D3


def test_one_number_format_in_text_tables_and_cli() -> None:
    # The browser rounds NumberColumn cells with sprintf-js and prints the result as
    # JavaScript does; the page's text and the CLI must read the same.
    from trials.numbers import format_value

    shown_by_browser = {
        0.03833332156156663: "0.03833",
        1.67e-05: "0.0000167",
        1.2e-07: "1.2e-7",
        1234567.0: "1235000",
        12345.678: "12350",
        2.26558463665e-06: "0.000002266",
        100.0: "100",
    }
    for value, text in shown_by_browser.items():
        assert _format.number(value) == format_value(value) == text
    assert _format.COLUMN == "%.4g" and _format.D3 == ".4~r"
