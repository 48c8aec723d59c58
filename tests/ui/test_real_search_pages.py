"""Every page of the real app, through AppTest, against a real ``slotsweep run``.

The database comes from ``real_search`` (a subprocess running the digits example:
real torchrun trials, real Optuna study, see ``tests/real_search.py``). What a
page must show is read back from that database, so the tests hold whichever trials
ASHA pruned. States this small search cannot produce are tested in ``test_pages.py``
against the synthetic seed.
"""

from __future__ import annotations

import io
import json
import sqlite3
import zipfile
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests.real_search import AGENT, AGENT_SLOTS, MAX_TRIALS, RealSearch
from tests.ui._pages import PageRenderer, assert_no_exception, texts
from ui import _format

pytestmark = pytest.mark.slow

METRIC = "val_loss"


def _rows(url: str, sql: str, **params: Any) -> list[sa.Row[Any]]:
    with get_engine(url).connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def _trials(url: str, experiment_id: int) -> list[sa.Row[Any]]:
    return _rows(
        url,
        "SELECT * FROM slotsweep_trials WHERE experiment_id = :e ORDER BY optuna_trial_number",
        e=experiment_id,
    )


def _best(search: RealSearch) -> sa.Row[Any]:
    completed = [t for t in _trials(search.url, search.experiment_id) if t.state == "COMPLETED"]
    return min(completed, key=lambda t: t.searcher_metric_value)


def _charts(app: Any, kind: str) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in app.get(kind)]


# --- Experiments ------------------------------------------------------------------------


def test_experiments_lists_the_finished_search(
    render: PageRenderer, real_search: RealSearch
) -> None:
    app = render("experiments", real_search.url)
    assert_no_exception(app)
    assert app.title[0].value == "Experiments"
    assert "Rows 1–1 of 1." in texts(app)
    row = app.dataframe[0].value.set_index("name").loc[real_search.name]
    states = [t.state for t in _trials(real_search.url, real_search.experiment_id)]
    assert row["state"] == "COMPLETED"
    assert row["done"] == f"{MAX_TRIALS}/{MAX_TRIALS}"
    assert (row["completed"], row["pruned"]) == (states.count("COMPLETED"), states.count("PRUNED"))
    assert (row["running"], row["failed"], row["slots_in_use"]) == (0, 0, 0)
    assert row["metric"] == METRIC
    assert row["best"] == pytest.approx(_best(real_search).searcher_metric_value)
    assert row["open"] == f"experiment?experiment={real_search.experiment_id}"


def test_experiments_shows_the_search_mid_run(
    render: PageRenderer, real_search: RealSearch
) -> None:
    app = render("experiments", real_search.running_url)
    assert_no_exception(app)
    row = app.dataframe[0].value.set_index("name").loc[real_search.name]
    ended = [t for t in _trials(real_search.running_url, real_search.experiment_id) if t.ended_at]
    assert row["state"] == "ACTIVE"
    assert row["done"] == f"{len(ended)}/{MAX_TRIALS}" and ended
    assert (row["running"], row["slots_in_use"]) == (1, 2)


# --- Experiment -------------------------------------------------------------------------


def test_experiment_shows_the_real_study(render: PageRenderer, real_search: RealSearch) -> None:
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    assert_no_exception(app)
    trials = _trials(real_search.url, real_search.experiment_id)
    best = _best(real_search)
    assert app.subheader[0].value == (
        f"{real_search.name} (#{real_search.experiment_id}) :green-badge[COMPLETED]"
    )
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["State"] == "COMPLETED"
    assert metrics["Trials done"] == f"{MAX_TRIALS}/{MAX_TRIALS}"
    assert metrics["Pruned"] == str(sum(t.state == "PRUNED" for t in trials))
    assert metrics[f"Best {METRIC}"] == f"{best.searcher_metric_value:.4g}"
    assert (
        f"Study `{real_search.study_name}` · searcher metric `{METRIC}` (smaller is better)"
        in texts(app)
    )
    completed = sorted(
        (t for t in trials if t.state == "COMPLETED"), key=lambda t: t.searcher_metric_value
    )
    best_table = app.dataframe[0].value
    assert list(best_table["number"]) == [t.optuna_trial_number for t in completed]
    assert list(best_table["state"].unique()) == ["COMPLETED"]
    table = app.dataframe[1].value
    assert list(table["number"]) == list(range(MAX_TRIALS))
    assert list(table["state"]) == [t.state for t in trials]
    assert list(table["batches"]) == [t.total_batches for t in trials]
    # The searched hyperparameters and the example's constants, one column each.
    assert table["hp.optimizer"].isin(["sgd", "adamw"]).all()
    assert set(table["hp.lr_scaling"]) == {"linear"}
    (history,) = _charts(app, "plotly_chart")
    assert "Optimization History" in json.dumps(history["layout"])


@pytest.mark.parametrize(
    ("kind", "title"),
    [
        ("Parameter importances", "Hyperparameter Importances"),
        ("Parallel coordinates", "Parallel Coordinate Plot"),
        ("Intermediate values", "Intermediate Values Plot"),
        ("Slice", "Slice Plot"),
        ("Contour", "Contour Plot"),
        ("Empirical distribution", "Empirical Distribution Function Plot"),
        ("Rank", "Rank"),
        ("Timeline", "Timeline Plot"),
    ],
)
def test_experiment_optuna_plots_of_the_real_study(
    render: PageRenderer, real_search: RealSearch, kind: str, title: str
) -> None:
    import optuna

    from storage import optuna_storage

    study = optuna.load_study(
        study_name=real_search.study_name, storage=optuna_storage(real_search.url)
    )
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    key = f"plot_kind_{real_search.experiment_id}"
    app.segmented_control(key=key).set_value(kind).run()
    assert_no_exception(app)
    if kind == "Parameter importances" and len(complete) < 5:
        assert (
            "Parameter importances need at least 5 completed trials to mean anything; "
            f"this study has {len(complete)}." in texts(app)
        )
        assert not app.get("plotly_chart")
        return
    (figure,) = _charts(app, "plotly_chart")
    assert title in json.dumps(figure["layout"])
    if kind == "Intermediate values":
        # One line per trial, through the values the runtime reported to Optuna per epoch.
        lines = {tuple(trace["y"]) for trace in figure["data"] if trace.get("y")}
        reported = {
            tuple(t.intermediate_values[step] for step in sorted(t.intermediate_values))
            for t in study.trials
        }
        assert lines == reported and all(len(v) >= 1 for v in reported)
    if kind == "Parallel coordinates":
        labels = json.dumps(figure["data"])
        assert all(name in labels for name in ("lr", "global_batch_size", "warmup_epochs"))


def test_experiment_links_to_each_real_trial(
    render: PageRenderer, real_search: RealSearch
) -> None:
    best = _best(real_search)
    app = render("experiment", real_search.url, experiment=real_search.experiment_id)
    app.number_input(key=f"open_trial_{real_search.experiment_id}").set_value(
        best.optuna_trial_number
    ).run()
    link = app.get("page_link")[0]
    assert link.proto.label == f"Open trial #{best.optuna_trial_number}"
    assert f"trial={real_search.experiment_id}.{best.optuna_trial_number}" in (
        link.proto.query_string
    )
    table = app.dataframe[1].value
    assert list(table["open"]) == [
        f"trial?trial={real_search.experiment_id}.{t.optuna_trial_number}"
        for t in _trials(real_search.url, real_search.experiment_id)
    ]


def test_pause_request_reaches_the_running_search(
    render: PageRenderer, writable_running_search: RealSearch
) -> None:
    url, experiment = writable_running_search.running_url, writable_running_search.experiment_id
    app = render("experiment", url, experiment=experiment)
    assert {m.label: m.value for m in app.metric}["Running"] == "1"
    app.radio(key=f"action_{experiment}").set_value("pause").run()
    app.checkbox(key=f"action_confirmed_{experiment}").check().run()
    app.button[0].click().run()
    assert_no_exception(app)
    assert "Requested pause of experiment" in texts(app)
    (row,) = _rows(url, "SELECT requested_action FROM slotsweep_experiments")
    assert row.requested_action == "pause"


# --- Trial ------------------------------------------------------------------------------


def test_trial_shows_everything_the_runtime_recorded(
    render: PageRenderer, real_search: RealSearch
) -> None:
    url, best = real_search.url, _best(real_search)
    app = render("trial", url, trial=best.id)
    assert_no_exception(app)
    shown = texts(app)
    assert app.subheader[0].value == f"Trial #{best.optuna_trial_number} of {real_search.name}"
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["State"] == "COMPLETED"
    assert metrics[METRIC] == f"{best.searcher_metric_value:.4g}"
    assert (metrics["Batches"], metrics["Slots"]) == (str(best.total_batches), "2")
    hparams = app.dataframe[0].value
    # 4 significant digits, and the exact value beside it (issue 33 item 2).
    assert dict(zip(hparams["hyperparameter"], hparams["value"], strict=True)) == {
        k: _format.number(v) for k, v in json.loads(best.hparams).items()
    }
    assert dict(zip(hparams["hyperparameter"], hparams["exact value"], strict=True)) == {
        k: _format.full(v) for k, v in json.loads(best.hparams).items()
    }

    # Metric curves: training loss and lr, validation val_accuracy and val_loss.
    assert [m.value for m in app.markdown if m.value.startswith("**")] == [
        "**loss**",
        "**lr**",
        "**val_accuracy**",
        "**val_loss**",
    ]
    counts = {
        row.kind: row.n
        for row in _rows(
            url,
            "SELECT kind, COUNT(*) AS n FROM slotsweep_metrics WHERE trial_id = :t GROUP BY kind",
            t=best.id,
        )
    }
    for kind in ("training", "validation"):
        recorded = counts[kind.upper()]
        assert (
            f"{kind.capitalize()} metrics averaged across ranks; {recorded} recorded values"
            in shown
        )

    # Checkpoints: the search's own, newest first; retention's deletions marked DELETED.
    stored = _rows(
        url,
        "SELECT uuid, step, state, path FROM slotsweep_checkpoints WHERE trial_id = :t"
        " ORDER BY step DESC",
        t=best.id,
    )
    table = app.dataframe[1].value
    assert list(table["uuid"]) == [c.uuid for c in stored]
    assert list(table["state"]) == [c.state for c in stored]
    assert list(table["on_disk"]) == [c.state == "COMPLETED" for c in stored]
    assert table["m.val_loss"].iloc[0] == pytest.approx(best.searcher_metric_value)
    assert app.download_button[0].label == f"Download checkpoint at step {stored[0].step}"

    # One launch, on the agent and slots the scheduler gave it.
    assert "No restarts: the trial ran once." in shown
    runs = app.dataframe[2].value
    assert list(runs["attempt"]) == [0]
    assert runs["agents"].iloc[0].startswith(f"{AGENT} slots ")

    # The log as torchrun's ranks wrote it.
    lines = app.code[0].value.splitlines()
    assert lines == Path(best.log_path).read_text().splitlines()
    # Every line is a rank's, but the launcher's own "[slotsweep] trial 1.1 attempt 0 ...".
    ranks = [line for line in lines if not line.startswith("[slotsweep] ")]
    assert {line[: len("[rank 0] ")] for line in ranks} == {"[rank 0] ", "[rank 1] "}

    # Profiling windows and psutil samples of this trial.
    timings = _rows(
        url,
        "SELECT name, SUM(count) AS batches FROM slotsweep_timings WHERE trial_id = :t"
        " GROUP BY name",
        t=best.id,
    )
    profile = app.dataframe[3].value.set_index("phase")
    assert {t.name: t.batches for t in timings} == profile["batches"].to_dict()
    assert {"train_batch", "dataloader_next", "reduce_metrics"} <= set(profile.index)
    system = app.dataframe[4].value
    names = _rows(
        url,
        "SELECT DISTINCT agent, name FROM slotsweep_system_metrics WHERE trial_id = :t",
        t=best.id,
    )
    assert set(zip(system["agent"], system["name"], strict=True)) == {
        (r.agent, r.name) for r in names
    }
    assert "cpu_util_percent" in set(system["name"]) and set(system["gpu"]) == {"host"}


def test_every_real_trial_renders_its_own_outcome(
    render: PageRenderer, real_search: RealSearch
) -> None:
    for trial in _trials(real_search.url, real_search.experiment_id):
        app = render("trial", real_search.url, trial=trial.id)
        assert_no_exception(app)
        metrics = {m.label: m.value for m in app.metric}
        assert metrics["State"] == trial.state
        assert metrics[METRIC] == f"{trial.searcher_metric_value:.4g}"
        kept = _rows(
            real_search.url, "SELECT id FROM slotsweep_checkpoints WHERE trial_id = :t", t=trial.id
        )
        if not kept:
            assert "This trial has no checkpoints recorded." in texts(app)
        # Each rank's last line says how the runtime ended the trial.
        outcome = "pruned" if trial.state == "PRUNED" else "finished"
        lines = app.code[0].value.splitlines()
        for rank in (0, 1):
            own = [line for line in lines if line.startswith(f"[rank {rank}] ")]
            assert own and own[-1].endswith(f": {outcome}"), lines


def test_step_axis_switches_to_epochs(render: PageRenderer, real_search: RealSearch) -> None:
    best = _best(real_search)
    app = render("trial", real_search.url, trial=best.id)
    app.radio(key=f"metric_axis_{best.id}").set_value("epochs").run()
    assert_no_exception(app)
    loss = _charts(app, "vega_lite_chart")[0]
    assert loss["encoding"]["x"]["field"] == "epoch"
    assert loss["encoding"]["x"]["title"] == "epoch"


def test_log_tail_filters_by_rank(render: PageRenderer, real_search: RealSearch) -> None:
    best = _best(real_search)
    app = render("trial", real_search.url, trial=best.id)
    rank_box = app.selectbox(key=f"log_rank_{best.id}")
    assert rank_box.options == ["all ranks", "rank 0", "rank 1"]
    for rank in (0, 1):
        rank_box.set_value(rank).run()
        lines = app.code[0].value.splitlines()
        assert lines and all(line.startswith(f"[rank {rank}] ") for line in lines)


def test_missing_checkpoint_file_is_reported(
    render: PageRenderer, real_search: RealSearch, missing_checkpoint: tuple[int, str]
) -> None:
    trial_id, path = missing_checkpoint
    app = render("trial", real_search.url, trial=trial_id)
    assert_no_exception(app)
    assert f"The checkpoint file is missing on disk: {path}" in texts(app)
    assert not app.download_button
    table = app.dataframe[1].value
    assert table.loc[table["path"] == path, "on_disk"].tolist() == [False]


def test_trial_caught_running_has_recorded_nothing_yet(
    render: PageRenderer, real_search: RealSearch
) -> None:
    url, trial_id = real_search.running_url, real_search.running_trial_id
    for table in ("metrics", "checkpoints", "timings", "system_metrics"):
        (row,) = _rows(
            url, f"SELECT COUNT(*) AS n FROM slotsweep_{table} WHERE trial_id = :t", t=trial_id
        )
        assert row.n == 0, table  # The snapshot was taken as the trial's ranks started.
    app = render("trial", url, trial=trial_id)
    assert_no_exception(app)
    shown = texts(app)
    assert {m.label: m.value for m in app.metric}["State"] == "RUNNING"
    assert "No metrics recorded for this trial yet." in shown
    assert "This trial has no checkpoints recorded." in shown
    assert "First launch, still running." in shown
    assert "Profiling timings not recorded for this trial" in shown
    assert "System metrics not recorded for this trial" in shown


def test_real_checkpoint_downloads_and_loads(real_search: RealSearch) -> None:
    import torch

    from ui import _checkpoints

    best = _best(real_search)
    (kept,) = _rows(
        real_search.url,
        "SELECT path FROM slotsweep_checkpoints WHERE trial_id = :t AND state = 'COMPLETED'"
        " ORDER BY step DESC LIMIT 1",
        t=best.id,
    )
    data = _checkpoints.checkpoint_bytes(kept.path)
    if Path(kept.path).is_dir():  # The runtime writes a directory: it downloads as a zip.
        archive = zipfile.ZipFile(io.BytesIO(data))
        (state_file,) = [n for n in archive.namelist() if n.endswith(".pt")]
        data = archive.read(state_file)
    state = torch.load(io.BytesIO(data), weights_only=True)
    assert isinstance(state, dict) and state


# --- Cluster ----------------------------------------------------------------------------


def test_cluster_after_the_search_has_every_slot_free(
    render: PageRenderer, real_search: RealSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(real_search.cluster_file))
    app = render("cluster", real_search.url)
    assert_no_exception(app)
    shown = texts(app)
    assert "Pool `default`" in shown
    assert f"1 agent(s), {AGENT_SLOTS} slot(s), 0 held, {AGENT_SLOTS} free." in shown
    assert "No slot is held: no trial is running." in shown
    agents = app.dataframe[0].value.set_index("agent")
    assert (agents.loc[AGENT, "slots"], agents.loc[AGENT, "held"]) == (AGENT_SLOTS, 0)


def test_cluster_mid_run_shows_the_slots_the_trial_holds(
    render: PageRenderer, real_search: RealSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(real_search.cluster_file))
    url, trial_id = real_search.running_url, real_search.running_trial_id
    allocated = _rows(
        url, "SELECT agent, slot, trial_id FROM slotsweep_allocations ORDER BY agent, slot"
    )
    assert {a.trial_id for a in allocated} == {trial_id} and len(allocated) == 2
    app = render("cluster", url)
    assert_no_exception(app)
    assert f"1 agent(s), {AGENT_SLOTS} slot(s), 2 held, {AGENT_SLOTS - 2} free." in texts(app)
    slots = app.dataframe[1].value
    held = slots[slots["state"] == "held"]
    assert list(zip(held["agent"], held["slot"], strict=True)) == [
        (a.agent, a.slot) for a in allocated
    ]
    assert set(held["experiment"]) == {real_search.name}
    (number,) = _rows(
        url, "SELECT optuna_trial_number FROM slotsweep_trials WHERE id = :t", t=trial_id
    )
    ref = f"{real_search.experiment_id}.{number.optuna_trial_number}"
    assert set(held["open"]) == {f"trial?trial={ref}"}
    assert app.dataframe[-1].value["trial_state"].tolist() == ["RUNNING", "RUNNING"]


# --- The UI only reads ------------------------------------------------------------------


def test_rendering_the_real_search_changes_nothing(
    render: PageRenderer, real_search: RealSearch, tmp_path: Path
) -> None:
    from tests.ui.conftest import copy_database

    url = copy_database(real_search.url, tmp_path / "copy.db")

    def dump() -> list[str]:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return list(conn.iterdump())

    before = dump()
    trial_ids = [t.id for t in _trials(url, real_search.experiment_id)]
    assert_no_exception(render("experiments", url))
    app = render("experiment", url, experiment=real_search.experiment_id)
    control = app.segmented_control(key=f"plot_kind_{real_search.experiment_id}")
    for kind in control.options:
        control.set_value(kind).run()
        assert_no_exception(app)
    for trial_id in trial_ids:
        assert_no_exception(render("trial", url, trial=trial_id))
    assert_no_exception(render("cluster", url))
    assert dump() == before
