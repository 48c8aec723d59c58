"""Every page of the real app, rendered through AppTest against seeded databases."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests._demo_data import DemoSearch
from tests.searcher.conftest import run_cli, wait_for, write_experiment
from tests.ui._pages import PageRenderer, assert_no_exception, texts
from trials._system_metrics import HOST_METRICS
from trials.pruning import rung_decisions


def _charts(app: object, kind: str) -> list[dict[str, object]]:
    return [json.loads(chart.proto.spec) for chart in app.get(kind)]  # type: ignore[attr-defined]


def _trial_row(url: str, trial_id: int) -> sa.Row[object]:
    with get_engine(url).connect() as conn:
        return conn.execute(
            sa.text("SELECT * FROM slotsweep_trials WHERE id = :id"), {"id": trial_id}
        ).one()


# --- Experiments ------------------------------------------------------------------------


def test_experiments_lists_every_experiment_with_progress(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("experiments", synthetic_search.url)
    assert_no_exception(app)
    assert app.title[0].value == "Experiments"
    table = app.dataframe[0].value.set_index("name")
    demo = table.loc["regression-demo"]
    # 8 trials: 7 finished (completed, pruned or failed) of max_trials 8, one running on 2 slots.
    assert demo["done"] == "7/8"
    assert (demo["running"], demo["failed"], demo["slots_in_use"]) == (1, 1, 2)
    assert demo["state"] == "ACTIVE"
    with get_engine(synthetic_search.url).connect() as conn:
        best = conn.execute(
            sa.text(
                "SELECT MIN(searcher_metric_value) FROM slotsweep_trials"
                " WHERE experiment_id = :e AND state = 'COMPLETED'"
            ),
            {"e": synthetic_search.experiment_id},
        ).scalar_one()
    assert demo["best"] == pytest.approx(best)
    assert table.loc["regression-cost", "state"] == "COMPLETED"
    assert table.loc["regression-cost", "done"] == "4/4"


def test_experiments_filters_by_state_and_name(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("experiments", synthetic_search.url)
    app.multiselect(key="experiments_states").set_value(["COMPLETED"]).run()
    assert list(app.dataframe[0].value["name"]) == ["regression-cost"]
    app.multiselect(key="experiments_states").set_value([]).run()
    app.text_input(key="experiments_name").set_value("DEMO").run()
    assert list(app.dataframe[0].value["name"]) == ["regression-demo"]
    app.text_input(key="experiments_name").set_value("no such search").run()
    assert "No experiment matches these filters." in texts(app)


def test_empty_database_says_so_on_every_page(render: PageRenderer, db_url: str) -> None:
    for page in ("experiments", "experiment", "trial", "cluster"):
        app = render(page, db_url)
        assert_no_exception(app)
        shown = texts(app)
        assert (
            "No experiments yet" in shown or "No trials yet" in shown or "No slot is held" in shown
        ), (
            page,
            shown,
        )


def test_missing_database_file_is_not_created(render: PageRenderer, tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    app = render("experiments", f"sqlite:///{path}")
    assert_no_exception(app)
    assert f"No database file at `{path}`" in texts(app)
    assert not path.exists()


def test_database_without_slotsweep_tables(render: PageRenderer, tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    sqlite3.connect(path).close()
    app = render("experiment", f"sqlite:///{path}")
    assert_no_exception(app)
    assert "has no slotsweep tables yet" in texts(app)


def test_unreachable_database_never_shows_the_password(render: PageRenderer) -> None:
    url = "postgresql://sweeper:s3cret-pw@127.0.0.1:1/sweeps"
    app = render("experiments", url)
    assert_no_exception(app)
    shown = texts(app) + "\n".join(str(c.value) for c in app.sidebar.caption)
    assert "Cannot read the database `postgresql://sweeper:***@127.0.0.1:1/sweeps`" in shown
    assert "s3cret-pw" not in shown


# --- Experiment -------------------------------------------------------------------------


def test_experiment_header_best_trials_and_history(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    assert_no_exception(app)
    assert app.subheader[0].value == (
        f"regression-demo (#{synthetic_search.experiment_id}) :blue-badge[ACTIVE]"
    )
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["Trials done"] == "7/8"
    assert metrics["Running"] == "1"
    assert metrics["Slots in use"] == "2"
    best = app.dataframe[0].value
    assert list(best["state"].unique()) == ["COMPLETED"]
    assert list(best["metric"]) == sorted(best["metric"])  # smaller is better: best first
    assert metrics["Best val_loss"] == f"{best['metric'].iloc[0]:.4g}"
    (history,) = _charts(app, "plotly_chart")
    assert "Optimization History" in json.dumps(history["layout"])


def test_optuna_tables_at_an_unknown_revision_leave_the_rest_of_the_page(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    from storage import KNOWN_OPTUNA_SCHEMAS

    with get_engine(writable_synthetic.url).begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'v9.0.0.a'"))
    experiment = writable_synthetic.experiment_id
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    assert_no_exception(app)
    assert {m.label: m.value for m in app.metric}["Trials done"] == "7/8"
    (refusal,) = [e.value for e in app.error]
    assert "schema revision v9.0.0.a" in refusal
    assert all(known in refusal for known in KNOWN_OPTUNA_SCHEMAS)
    assert not app.get("plotly_chart")


@pytest.mark.parametrize(
    ("kind", "title"),
    [
        ("Parallel coordinates", "Parallel Coordinate Plot"),
        ("Intermediate values", "Intermediate Values Plot"),
        ("Slice", "Slice Plot"),
        ("Contour", "Contour Plot"),
        ("Empirical distribution", "Empirical Distribution Function Plot"),
        ("Rank", "Rank"),
        ("Timeline", "Timeline Plot"),
    ],
)
def test_experiment_optuna_plots(
    render: PageRenderer, synthetic_search: DemoSearch, kind: str, title: str
) -> None:
    app = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    app.segmented_control(key=f"plot_kind_{synthetic_search.experiment_id}").set_value(kind).run()
    assert_no_exception(app)
    (figure,) = _charts(app, "plotly_chart")
    assert title in json.dumps(figure["layout"])


def test_multi_objective_experiment_shows_the_pareto_front(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    import optuna

    from storage import optuna_storage

    experiment = synthetic_search.multi_objective_experiment_id
    app = render("experiment", synthetic_search.url, experiment=experiment)
    assert_no_exception(app)
    control = app.segmented_control(key=f"plot_kind_{experiment}")
    assert control.value == "Pareto front"  # the natural first plot of a multi-objective study
    (figure,) = _charts(app, "plotly_chart")
    layout = json.dumps(figure["layout"])
    assert "Pareto-front Plot" in layout
    assert "slot_seconds" in layout and "val_loss" in layout
    # The best trials are Optuna's Pareto-optimal ones.
    with get_engine(synthetic_search.url).connect() as conn:
        study_name = conn.execute(
            sa.text("SELECT study_name FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment},
        ).scalar_one()
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(synthetic_search.url))
    assert "Best trials (Pareto front)" in texts(app)
    assert sorted(app.dataframe[0].value["number"]) == sorted(t.number for t in study.best_trials)
    # Its pruner (MO-ASHA) stopped trial 1 at its first rung: where, and with what values.
    assert "Pruned trials: where they stopped" in texts(app)
    stops = app.dataframe[1].value
    decisions = rung_decisions(study.user_attrs)
    pruned = [t.number for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert 1 in pruned
    assert list(stops["trial"]) == [f"{experiment}.{number}" for number in pruned]
    first = stops.iloc[0]
    assert (first["rung"], first["stopped at"]) == (0, "epoch 1")
    assert (first["val_loss"], first["slot_seconds"]) == pytest.approx(decisions[1][0].values)
    assert first["open"].startswith(f"trial?trial={experiment}.1")
    control.set_value("Optimization history").run()
    assert_no_exception(app)
    assert "Optimization History" in json.dumps(_charts(app, "plotly_chart")[0]["layout"])


def test_trials_table_sorts_and_filters_in_sql(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    experiment = synthetic_search.experiment_id
    app = render("experiment", synthetic_search.url, experiment=experiment)
    table = app.dataframe[1].value
    assert list(table["number"]) == list(range(8))
    app.selectbox(key=f"trial_sort_{experiment}").set_value("metric").run()
    app.toggle(key=f"trial_desc_{experiment}").set_value(True).run()
    by_metric = app.dataframe[1].value
    values = by_metric["metric"].dropna().tolist()
    assert values == sorted(values, reverse=True)
    assert by_metric["metric"].isna().tolist()[-2:] == [True, True]  # no value: last
    app.multiselect(key=f"trial_states_{experiment}").set_value(["PRUNED", "ERROR"]).run()
    assert set(app.dataframe[1].value["state"]) == {"PRUNED", "ERROR"}


def test_experiment_links_to_trials(render: PageRenderer, synthetic_search: DemoSearch) -> None:
    app = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    app.number_input(key=f"open_trial_{synthetic_search.experiment_id}").set_value(3).run()
    link = app.get("page_link")[0]
    assert link.proto.label == "Open trial #3"
    # Links name the trial as the logs do (EXPERIMENT.NUMBER), never by database id.
    ref = f"{synthetic_search.experiment_id}.3"
    assert f"trial={ref}" in link.proto.query_string
    table = app.dataframe[1].value
    assert table.loc[table["number"] == 3, "open"].item() == f"trial?trial={ref}"


def test_parameter_importances_need_five_completed_trials(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    import optuna

    from storage import Experiment, ExperimentState, optuna_storage, session_scope

    study = optuna.create_study(
        study_name="one-trial", storage=optuna_storage(writable_synthetic.url)
    )
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with session_scope(writable_synthetic.url) as session:
        experiment = Experiment(
            name="one-trial",
            study_name="one-trial",
            state=ExperimentState.ACTIVE,
            config={"searcher": {"metric": "x", "smaller_is_better": True}},
            model_dir=".",
            max_trials=5,
        )
        session.add(experiment)
        session.flush()
        experiment_id = experiment.id
    app = render("experiment", writable_synthetic.url, experiment=experiment_id)
    app.segmented_control(key=f"plot_kind_{experiment_id}").set_value(
        "Parameter importances"
    ).run()
    assert_no_exception(app)
    assert (
        "Parameter importances need at least 5 completed trials to mean anything; "
        "this study has 1." in texts(app)
    )
    assert not app.get("plotly_chart")


def test_unknown_experiment_falls_back_to_the_newest(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("experiment", synthetic_search.url, experiment=9999)
    assert_no_exception(app)
    assert "Experiment 9999 does not exist" in texts(app)
    assert app.subheader[0].value.startswith("regression-cost")


def test_a_bare_trial_number_says_how_trials_are_named(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    # ``?trial=0``: a user typing the number of the logs, not an old link's database id.
    app = render("trial", synthetic_search.url, trial=0)
    assert_no_exception(app)
    assert (
        "Trial 0 does not exist (a trial is named EXPERIMENT.NUMBER as in the logs, "
        "e.g. ?trial=1.0); showing the newest trial." in texts(app)
    )


def test_pause_requires_confirmation_then_records_the_request(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    experiment = writable_synthetic.experiment_id
    app = render("experiment", writable_synthetic.url, experiment=experiment)
    button = app.button[0]
    assert button.label == "Send request" and button.disabled
    with get_engine(writable_synthetic.url).connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT requested_action FROM slotsweep_experiments WHERE id = :e"),
                {"e": experiment},
            ).scalar_one()
            is None
        )
    app.radio(key=f"action_{experiment}").set_value("pause").run()
    app.checkbox(key=f"action_confirmed_{experiment}").check().run()
    app.button[0].click().run()
    assert_no_exception(app)
    assert "Requested pause of experiment" in texts(app)
    with get_engine(writable_synthetic.url).connect() as conn:
        action = conn.execute(
            sa.text("SELECT requested_action FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment},
        ).scalar_one()
    assert action == "pause"
    # The confirmation was used up: another request needs another tick.
    assert not app.checkbox(key=f"action_confirmed_{experiment}").value
    assert app.button[0].disabled


@pytest.mark.slow
def test_resume_starts_a_driver_that_runs_the_search_to_its_end(
    render: PageRenderer,
    tmp_path: Path,
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Resume button for real: a search created with ``--detach`` is started from the
    page, and the driver it starts (a process of its own) runs it to COMPLETED."""
    path = write_experiment(
        tmp_path / "exp",
        searcher={"max_trials": 1, "max_length": {"batches": 4}, "pruner": {"name": "none"}},
    )
    db = f"sqlite:///{tmp_path / 'search.db'}"
    created = run_cli(
        ["run", str(path), "--db", db, "--detach", "--slots", "2"], cli_env, tmp_path
    )
    assert created.returncode == 0, created.stderr
    # The driver's log goes to the temporary folder, this test's own.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    app = render("experiment", db, experiment=1)
    # The driver runs on this machine (the renderer's cluster file is the synthetic one).
    monkeypatch.delenv("SLOTSWEEP_CLUSTER")
    assert_no_exception(app)
    app.radio(key="action_1").set_value("resume").run()
    app.checkbox(key="action_confirmed_1").check().run()
    app.button[0].click().run()
    assert_no_exception(app)
    said = texts(app)
    assert "Started `slotsweep resume 1` (pid " in said, said
    pid = int(said.split("(pid ", 1)[1].split(")", 1)[0])
    try:
        # A session of its own (the driver takes seconds to start: it is still there):
        # it outlives the page and the UI's server.
        assert os.getsid(pid) == pid
        wait_for(lambda: _experiment_state(db) == "COMPLETED", timeout=300, what="COMPLETED")
        with get_engine(db).connect() as conn:
            states = conn.execute(sa.text("SELECT state FROM slotsweep_trials")).scalars().all()
        assert states == ["COMPLETED"]
        # Its last line comes after the state it reports is written (a CI run read the
        # log in between and found it still empty).
        log = tmp_path / "slotsweep-resume-1.log"
        wait_for(
            lambda: log.exists() and "experiment 1 COMPLETED" in log.read_text(),
            timeout=60,
            what=f"the driver's last line in {log}",
        )
    finally:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
    finished = render("experiment", db, experiment=1)
    assert_no_exception(finished)
    assert {m.label: m.value for m in finished.metric}["State"] == "COMPLETED"
    assert not finished.button


def _experiment_state(db: str) -> str:
    with get_engine(db).connect() as conn:
        return str(conn.execute(sa.text("SELECT state FROM slotsweep_experiments")).scalar_one())


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_finished_experiment_offers_no_actions(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    # The same renderer offers the actions on an experiment that is not finished: the
    # page is allowed to show them, so their absence below is the state's doing.
    live = render("experiment", synthetic_search.url, experiment=synthetic_search.experiment_id)
    assert_no_exception(live)
    assert [b.label for b in live.button] == ["Send request"]
    finished = synthetic_search.multi_objective_experiment_id
    app = render("experiment", synthetic_search.url, experiment=finished)
    # The page drew the whole finished experiment (a page that crashed would show no
    # button either): its headline, its state and its trials.
    assert_no_exception(app)
    assert app.subheader[0].value.startswith("regression-cost (#")
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["State"] == "COMPLETED"
    assert app.dataframe and not app.dataframe[0].value.empty
    # And no way to act on it: no choice of action, no confirmation, no button.
    assert not app.button
    assert not app.get("radio")
    assert not [c for c in app.checkbox if c.key == f"action_confirmed_{finished}"]


# --- Trial ------------------------------------------------------------------------------


def test_completed_trial_shows_everything_it_recorded(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    trial_id = synthetic_search.completed_trial_id
    app = render("trial", synthetic_search.url, trial=trial_id)
    assert_no_exception(app)
    row = _trial_row(synthetic_search.url, trial_id)
    shown = texts(app)
    assert app.subheader[0].value == f"Trial #{row.optuna_trial_number} of regression-demo"
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["State"] == "COMPLETED"
    assert metrics["val_loss"] == f"{row.searcher_metric_value:.4g}"
    assert metrics["Batches"] == str(row.total_batches)
    hparams = dict(
        zip(app.dataframe[0].value["hyperparameter"], app.dataframe[0].value["value"], strict=True)
    )
    assert hparams == {k: str(v) for k, v in json.loads(row.hparams).items()}
    # One chart per metric: training loss and lr, validation val_loss.
    assert [m.value for m in app.markdown if m.value.startswith("**")] == [
        "**loss**",
        "**lr**",
        "**val_loss**",
    ]
    assert len(app.get("vega_lite_chart")) >= 3
    assert (
        f"Training metrics averaged across ranks; {2 * row.total_batches} recorded values" in shown
    )
    # Checkpoints: the newest is downloadable; the oldest was deleted by retention.
    checkpoints = app.dataframe[1].value
    assert list(checkpoints["step"]) == sorted(checkpoints["step"], reverse=True)
    assert checkpoints["state"].iloc[-1] == "DELETED"
    assert (
        app.download_button[0].label
        == f"Download checkpoint at step {checkpoints['step'].iloc[0]}"
    )
    assert "No restarts: the trial ran once." in shown
    assert "[rank 0] epoch 0 batch 0" in app.code[0].value
    phases = set(app.dataframe[3].value["phase"])
    assert {"train_batch", "dataloader_next", "reduce_metrics"} <= phases
    # The host's metrics, as the system-metrics sampler records them (rates where known).
    names = set(app.dataframe[4].value["name"])
    assert {"cpu_util_percent", "memory_used_gb", "memory_util_percent"} <= names
    assert names <= set(HOST_METRICS)


def test_step_axis_switches_to_epochs(render: PageRenderer, synthetic_search: DemoSearch) -> None:
    trial_id = synthetic_search.completed_trial_id
    app = render("trial", synthetic_search.url, trial=trial_id)
    app.radio(key=f"metric_axis_{trial_id}").set_value("epochs").run()
    assert_no_exception(app)
    spec = json.dumps(_charts(app, "vega_lite_chart")[0])
    assert '"epoch"' in spec


def test_log_tail_filters_by_rank(render: PageRenderer, synthetic_search: DemoSearch) -> None:
    trial_id = synthetic_search.completed_trial_id
    app = render("trial", synthetic_search.url, trial=trial_id)
    rank_box = app.selectbox(key=f"log_rank_{trial_id}")
    assert rank_box.options == ["all ranks", "rank 0", "rank 1"]
    rank_box.set_value(1).run()
    lines = app.code[0].value.splitlines()
    assert lines and all(line.startswith("[rank 1] ") for line in lines)


def test_trial_without_metrics_says_what_is_missing(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("trial", synthetic_search.url, trial=synthetic_search.running_trial_id)
    assert_no_exception(app)
    shown = texts(app)
    assert "No metrics recorded for this trial yet." in shown
    assert "This trial has no checkpoints recorded." in shown
    assert "Profiling timings not recorded for this trial" in shown
    assert "System metrics not recorded for this trial" in shown
    assert "First launch, still running." in shown
    assert {m.label: m.value for m in app.metric}["State"] == "RUNNING"


def test_missing_checkpoint_file_is_reported_not_raised(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    trial_id = synthetic_search.missing_checkpoint_trial_id
    app = render("trial", synthetic_search.url, trial=trial_id)
    assert_no_exception(app)
    # The newest checkpoint (selected first) is the one removed from disk.
    assert (
        f"The checkpoint file is missing on disk: {synthetic_search.missing_checkpoint_path}"
        in texts(app)
    )
    assert not app.download_button
    table = app.dataframe[1].value
    assert table["on_disk"].tolist()[:2] == [False, True]
    # The older checkpoint is still on disk and downloadable.
    app.selectbox(key=f"ckpt_{trial_id}").set_value(table["uuid"].iloc[1]).run()
    assert_no_exception(app)
    assert app.download_button[0].label == f"Download checkpoint at step {table['step'].iloc[1]}"


def test_restarted_trial_lists_each_launch(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("trial", synthetic_search.url, trial=synthetic_search.restarted_trial_id)
    assert_no_exception(app)
    assert "Restarted 1 time(s); each row is one launch." in texts(app)
    runs = app.dataframe[2].value
    assert list(runs["attempt"]) == [0, 1]
    assert runs["exit_code"].tolist() == [-9, 0]
    assert runs["restored_from_step"].iloc[1] > 0


def test_a_skipped_damaged_checkpoint_is_named_with_why(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    """A restart that skipped a damaged checkpoint: the page says which and why (a
    warning above the table, its problem in the table), and the run's reason says
    where it continued from."""
    trial_id = writable_synthetic.restarted_trial_id
    with get_engine(writable_synthetic.url).begin() as conn:
        damaged = conn.execute(
            sa.text(
                "SELECT uuid, step FROM slotsweep_checkpoints WHERE trial_id = :t "
                "ORDER BY step DESC LIMIT 1"
            ),
            {"t": trial_id},
        ).one()
        problem = "state.pt: 64 bytes, its manifest says 6221"
        conn.execute(
            sa.text(
                "UPDATE slotsweep_checkpoints SET state = 'CORRUPTED', problem = :p "
                "WHERE uuid = :u"
            ),
            {"p": problem, "u": damaged.uuid},
        )
        note = (
            f"continued from the checkpoint of step 4; skipped the checkpoint of step "
            f"{damaged.step} ({damaged.uuid[:8]}): {problem}"
        )
        conn.execute(
            sa.text(
                "UPDATE slotsweep_trial_runs SET reason = :r WHERE trial_id = :t AND attempt = 1"
            ),
            {"r": note, "t": trial_id},
        )
    app = render("trial", writable_synthetic.url, trial=trial_id)
    assert_no_exception(app)
    assert app.warning[0].value == (
        f"The checkpoint of step {damaged.step} ({damaged.uuid[:8]}) was skipped as damaged: "
        f"{problem}. Its files are kept for inspection ("
        + app.dataframe[1].value["path"].iloc[0]
        + "); no restore uses it again."
    )
    table = app.dataframe[1].value
    assert (table["state"].iloc[0], table["problem"].iloc[0]) == ("CORRUPTED", problem)
    assert table["problem"].iloc[1:].isna().all()
    runs = app.dataframe[2].value
    assert runs["reason"].iloc[1] == note


def test_failed_trial_shows_its_error(render: PageRenderer, synthetic_search: DemoSearch) -> None:
    app = render("trial", synthetic_search.url, trial=synthetic_search.failed_trial_id)
    assert_no_exception(app)
    assert "max_restarts (1) exhausted" in app.error[0].value


def test_trial_picker_moves_to_another_trial(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("trial", synthetic_search.url, trial=synthetic_search.completed_trial_id)
    app.number_input[0].set_value(3).run()
    assert_no_exception(app)
    assert app.query_params["trial"] == f"{synthetic_search.experiment_id}.3"
    assert app.subheader[0].value == "Trial #3 of regression-demo"


def test_trial_page_without_a_trial_shows_the_newest(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("trial", synthetic_search.url)
    assert_no_exception(app)
    assert app.subheader[0].value.endswith("of regression-cost")


# --- Cluster ----------------------------------------------------------------------------


def test_cluster_lists_every_slot_and_its_holder(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("cluster", synthetic_search.url)
    assert_no_exception(app)
    assert "Pool `default`" in texts(app)
    with get_engine(synthetic_search.url, read_only=True).connect() as conn:
        number = conn.execute(
            sa.text("SELECT optuna_trial_number FROM slotsweep_trials WHERE id = :i"),
            {"i": synthetic_search.running_trial_id},
        ).scalar_one()
    running = f"{synthetic_search.experiment_id}.{number}"
    agents = app.dataframe[0].value.set_index("agent")
    assert (agents.loc["agent-0", "slots"], agents.loc["agent-0", "held"]) == (4, 2)
    slots = app.dataframe[1].value
    held = slots[(slots["agent"] == "agent-0") & (slots["state"] == "held")]
    assert held["slot"].tolist() == [0, 1]
    assert set(held["experiment"]) == {"regression-demo"}
    assert set(held["open"]) == {f"trial?trial={running}"}
    # Issue 33: a free slot's cells are empty, not "None"; trials are EXP.N, not a bare #.
    free = slots[slots["state"] == "free"]
    assert len(free) and {*free["experiment"], *free["open"], *free["warm job"]} == {""}
    assert "trial #" not in slots.columns
    allocations = app.dataframe[3].value
    assert allocations["trial_state"].tolist() == ["RUNNING", "RUNNING"]
    assert "trial_number" not in app.dataframe[3].proto.column_order
    assert set(allocations["warm_job_id"]) == set(allocations["warm_state"]) == {""}


def test_cluster_without_a_layout_shows_held_slots_and_says_why(
    render: PageRenderer,
    synthetic_search: DemoSearch,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(tmp_path / "no-such-cluster.yaml"))
    app = render("cluster", synthetic_search.url)
    assert_no_exception(app)
    assert "Could not load the cluster layout" in texts(app)
    assert app.dataframe[-1].value["slot"].tolist() == [0, 1]


# --- The UI only reads ------------------------------------------------------------------


def test_rendering_every_page_leaves_the_database_unchanged(
    render: PageRenderer, writable_synthetic: DemoSearch
) -> None:
    path = writable_synthetic.url.removeprefix("sqlite:///")

    def dump() -> list[str]:
        with sqlite3.connect(path) as conn:
            return list(conn.iterdump())

    before = dump()
    url = writable_synthetic.url
    pages: tuple[tuple[str, dict[str, Any]], ...] = (
        ("experiments", {}),
        ("experiment", {"experiment": writable_synthetic.experiment_id}),
        ("experiment", {"experiment": writable_synthetic.multi_objective_experiment_id}),
        ("trial", {"trial": writable_synthetic.completed_trial_id}),
        ("trial", {"trial": writable_synthetic.missing_checkpoint_trial_id}),
        ("cluster", {}),
    )
    for page, query in pages:
        assert_no_exception(render(page, url, **query))
    assert dump() == before


def test_sidebar_shows_the_database_and_the_refresh_interval(
    monkeypatch: pytest.MonkeyPatch, synthetic_search: DemoSearch
) -> None:
    from streamlit.testing.v1 import AppTest

    from ui import APP_PATH

    monkeypatch.setenv("SLOTSWEEP_DB", synthetic_search.url)
    # The sidebar is checked on the first run: this Streamlit's AppTest drops sidebar
    # elements from reruns of an st.navigation app (a real browser keeps them).
    app = AppTest.from_file(str(APP_PATH), default_timeout=60).run()
    assert app.sidebar.caption[0].value == f"Database: `{synthetic_search.url}`"
    refresh = app.sidebar.selectbox[0]
    assert (refresh.label, refresh.value) == ("Auto-refresh", "5 s")
    refresh.set_value("off").run()  # Fragments then re-run only on interaction.
    assert_no_exception(app)
    assert list(app.dataframe[0].value["name"]) == ["regression-cost", "regression-demo"]
