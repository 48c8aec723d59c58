"""The Python API (``searcher.api``): refusals before anything is written, the DataFrames
and checkpoints of a seeded database, and one real search started from Python, watched
through a second handle and seen by ``slotsweep list``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from sqlalchemy import insert

import searcher.api as api
from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    metric_rows,
    session_scope,
    utcnow,
)
from tests.conftest import EXAMPLES_DIR
from tests.searcher.conftest import run_cli, write_experiment
from tests.trials.test_control import make_experiment
from trials.config import ConfigError


def test_a_bad_mapping_lists_every_problem_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "search.db"
    config = {"name": "x", "entrypoint": "model:Trial", "max_restarts": -1, "typo": 1}
    with pytest.raises(ConfigError) as raised:
        api.run(config, db=f"sqlite:///{db}")
    problems = raised.value.problems
    assert len(problems) >= 4, problems
    assert any(p.startswith("hyperparameters:") for p in problems)
    assert any(p.startswith("max_restarts:") for p in problems)
    assert any(p.startswith("typo:") for p in problems)
    assert not db.exists()


def test_a_cluster_problem_is_a_config_error_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every problem of a new run, not only the config's, is one ConfigError."""
    db = tmp_path / "search.db"
    config = yaml.safe_load(write_experiment(tmp_path / "exp").read_text())
    monkeypatch.chdir(tmp_path / "exp")  # a mapping's entrypoint is looked up here
    config["resources"]["resource_pool"] = "nowhere"
    with pytest.raises(ConfigError) as raised:
        api.run(config, db=f"sqlite:///{db}", slots=1)
    assert raised.value.problems[0].startswith("resources.resource_pool:")
    assert not db.exists()


class _Inline:
    """A trial class the ranks could not import by name (see the tests below)."""


def test_a_trial_class_of_a_notebook_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "search.db"
    config: dict[str, Any] = yaml.safe_load(write_experiment(tmp_path / "exp").read_text())

    class Local:
        pass

    notebook = type("NotebookTrial", (), {"__module__": "__main__"})
    for trial_class in (notebook, Local):
        with pytest.raises(ConfigError) as raised:
            api.run({**config, "entrypoint": trial_class}, db=f"sqlite:///{db}")
        (problem,) = raised.value.problems
        assert problem.startswith(f"entrypoint: {trial_class.__qualname__} is defined in")
        assert "move it into a file" in problem
    assert not db.exists()


@pytest.fixture
def seeded(db_url: str, tmp_path: Path) -> api.Experiment:
    """A COMPLETED experiment: trial 0 completed with metrics and a checkpoint, trial 1 failed."""
    experiment_id = make_experiment(db_url, tmp_path / "exp", "COMPLETED")
    folder = tmp_path / "checkpoints" / "step-20"
    folder.mkdir(parents=True)
    torch.save({"models": [{"weight": torch.ones(2)}]}, folder / "state.pt")
    with session_scope(db_url) as session:
        done, failed = session.query(Trial).order_by(Trial.optuna_trial_number)
        done.searcher_metric_value, done.slot_seconds, done.restarts = 0.25, 12.5, 1
        failed.state, failed.error = ExperimentState.ERROR.value, "ValueError: bad shape"
        failed.hparams = {"lr": 0.01, "optimizer": "sgd"}
        rows = metric_rows(done.id, 10, MetricKind.TRAINING, {"loss": 0.9}, 1.0)
        rows += metric_rows(done.id, 20, MetricKind.VALIDATION, {"validation_loss": 0.25}, 2.0)
        rows += metric_rows(done.id, 20, MetricKind.TRAINING, {"loss": float("nan")}, 2.0)
        session.execute(insert(Metric), rows)
        session.add(
            Checkpoint(
                uuid=str(uuid.uuid4()),
                trial_id=done.id,
                step=20,
                path=str(folder),
                state=CheckpointState.COMPLETED,
            )
        )
    return api.Experiment.open(experiment_id, db=db_url)


def test_trials_best_trial_and_metrics_of_a_seeded_database(seeded: api.Experiment) -> None:
    trials = seeded.trials()
    assert list(trials.columns) == [
        "number",
        "state",
        "searcher_metric",
        "hyperparameters",
        "slot_seconds",
        "restarts",
        "failure_reason",
        "params_lr",
        "params_optimizer",
    ]
    assert trials["number"].tolist() == [0, 1]
    assert trials["state"].tolist() == ["COMPLETED", "ERROR"]
    assert trials["searcher_metric"].tolist()[0] == 0.25
    assert trials["slot_seconds"].tolist() == [12.5, 0.0]
    assert trials["failure_reason"].isna().tolist() == [True, False]
    assert trials["failure_reason"].tolist()[1] == "ValueError: bad shape"
    assert trials["hyperparameters"].tolist()[0] == {"lr": 0.1}
    # One column per hyperparameter, as Optuna's trials_dataframe has them.
    assert trials["params_lr"].tolist() == [0.1, 0.01]
    assert trials["params_optimizer"].isna().tolist() == [True, False]  # trial 0 has none
    assert trials["params_optimizer"].tolist()[1] == "sgd"

    best = seeded.best_trial
    assert best is not None and (best.number, best.searcher_metric) == (0, 0.25)
    assert best.restarts == 1

    metrics = seeded.metrics(0)
    assert metrics[["step", "kind", "name"]].values.tolist() == [
        [10, "training", "loss"],
        [20, "training", "loss"],
        [20, "validation", "validation_loss"],
    ]
    assert metrics["value"].isna().tolist() == [False, True, False]  # the NaN recorded
    assert seeded.metrics(1).empty
    with pytest.raises(
        LookupError, match=r"^experiment \d+ has no trial #7; its trials are #0 to #1$"
    ):
        seeded.metrics(7)


def test_every_method_takes_a_trial_as_the_cli_and_the_ui_name_it(
    seeded: api.Experiment, db_url: str, tmp_path: Path
) -> None:
    """Its number, its label (``#0``, ``E.0``) or the TrialSummary the API returns."""
    other = api.Experiment.open(make_experiment(db_url, tmp_path / "other", "COMPLETED"), db_url)
    with session_scope(db_url) as session:
        trial = session.query(Trial).filter_by(experiment_id=other.id, optuna_trial_number=0).one()
        session.execute(insert(Metric), metric_rows(trial.id, 5, MetricKind.TRAINING, {"x": 1.0}))
    best = seeded.best_trial
    assert best is not None and best.label == f"{seeded.id}.0"
    summaries = {t.number: t for t in seeded._summaries()}
    expected = seeded.metrics(0)
    assert len(expected) == 3 and seeded.metrics(1).empty
    for form in (0, np.int64(0), "#0", " #0 ", f"{seeded.id}.0", best, summaries[0]):
        assert seeded.metrics(form).equals(expected), form
        assert seeded.checkpoint_path(form) == seeded.checkpoint_path()
    torch.testing.assert_close(seeded.load_checkpoint("#0"), seeded.load_checkpoint(best))
    # Experiment 2's trial 0 is its own, by each of its names.
    assert other.id != seeded.id
    for form in (0, "#0", f"{other.id}.0"):
        assert other.metrics(form)["name"].tolist() == ["x"]
    assert seeded.metrics(f"{seeded.id}.1").empty  # "1.1" is trial 1, never trial 0's "1"


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        (1.0, TypeError, r"^trial: got 1\.0 \(float\); give its number \(3\), its label"),
        (True, TypeError, r"^trial: got True \(bool\); give its number"),
        ([0], TypeError, r"^trial: got \[0\] \(list\); give its number"),
        (
            "0",
            LookupError,
            r"^trial: '0' names no trial; give its number \(3\), its label \('#3' or '\d+\.3'\)",
        ),
        ("trial 0", LookupError, r"^trial: 'trial 0' names no trial; give"),
        ("#x", LookupError, r"^trial: '#x' names no trial; give"),
        (
            "99.0",
            LookupError,
            r"^trial: '99\.0' names a trial of experiment 99, not of experiment \d+$",
        ),
        ("#5", LookupError, r"^experiment \d+ has no trial #5; its trials are #0 to #1$"),
        (-1, LookupError, r"^experiment \d+ has no trial #-1; its trials are #0 to #1$"),
        (2**70, LookupError, r"^experiment \d+ has no trial #1180591620717411303424; its trials"),
    ],
    ids=[
        "float",
        "bool",
        "list",
        "bare-string",
        "words",
        "hash-words",
        "other-experiment",
        "missing",
        "negative",
        "huge",
    ],
)
def test_anything_else_is_refused_in_one_line_not_by_the_database(
    seeded: api.Experiment, given: Any, error: type[Exception], message: str
) -> None:
    for method in (seeded.metrics, seeded.checkpoint_path, seeded.load_checkpoint):
        with pytest.raises(error, match=message) as raised:
            method(given)
        assert type(raised.value) is error and "\n" not in str(raised.value)


def test_metrics_needs_a_trial_where_checkpoints_default_to_the_best(
    seeded: api.Experiment,
) -> None:
    with pytest.raises(TypeError, match=r"^trial: got None \(NoneType\); give its number"):
        seeded.metrics(None)  # type: ignore[arg-type]
    assert seeded.checkpoint_path(None) == seeded.checkpoint_path(0)


def test_a_summary_of_another_experiment_is_refused(
    seeded: api.Experiment, db_url: str, tmp_path: Path
) -> None:
    other = api.Experiment.open(make_experiment(db_url, tmp_path / "other", "COMPLETED"), db_url)
    theirs = other._summaries()[0]
    with pytest.raises(LookupError) as raised:
        seeded.metrics(theirs)
    assert str(raised.value) == (
        f"trial: {other.id}.0 is a trial of experiment {other.id}, not of experiment {seeded.id}"
    )


def test_checkpoints_study_and_handles_of_a_seeded_database(seeded: api.Experiment) -> None:
    assert seeded.checkpoint_path() == seeded.checkpoint_path(0)
    assert seeded.checkpoint_path().name == "step-20"
    state = seeded.load_checkpoint()
    assert torch.equal(state["models"][0]["weight"], torch.ones(2))
    with pytest.raises(LookupError, match="no completed checkpoint"):
        seeded.checkpoint_path(1)
    assert [t.number for t in seeded.study.trials] == [0, 1]
    again = api.Experiment.open(seeded.name, db=seeded.db_url)
    assert (again.id, again.state) == (seeded.id, ExperimentState.COMPLETED)
    assert repr(again) == f"Experiment(id={seeded.id}, name='{seeded.name}', state=COMPLETED)"


def test_pause_goes_through_the_control_path_and_wait_times_out(
    db_url: str, tmp_path: Path
) -> None:
    # "running": this process is the live driver (pid and heartbeat), as control sees it.
    experiment = api.Experiment.open(make_experiment(db_url, tmp_path / "exp", "running"), db_url)
    assert "pause" in experiment.pause()
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment.id)
        assert row is not None and row.requested_action == "pause"
    with pytest.raises(TimeoutError, match="still ACTIVE"):
        experiment.wait(timeout=0.2)


def _requested_action(db_url: str, experiment_id: int) -> str | None:
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment_id)
        assert row is not None
        return row.requested_action


def _play_driver(db_url: str, experiment_id: int, presses: int, pause: bool, before: Any) -> None:
    """Ctrl-C ``presses`` times as a notebook's interrupt sends it (SIGINT to this process,
    run by its main thread), then the driver's part: its heartbeat stays fresh until it
    sees the pause asked, and with ``pause`` it then pauses the search. It presses once
    the wait has put its handler in the place of ``before``, the one there at the start."""
    deadline = time.monotonic() + 60
    while signal.getsignal(signal.SIGINT) is before and time.monotonic() < deadline:
        time.sleep(0.01)
    asked_at: float | None = None
    while time.monotonic() < deadline:
        with session_scope(db_url) as session:
            row = session.get(Experiment, experiment_id)
            assert row is not None
            row.driver_heartbeat_at = utcnow()
            if row.requested_action == "pause":
                asked_at = asked_at or time.monotonic()
                if pause:
                    row.state = ExperimentState.PAUSED
                    return
        if presses:
            presses -= 1
            os.kill(os.getpid(), signal.SIGINT)
        elif asked_at is not None:
            return
        time.sleep(0.2)


def test_ctrl_c_while_waiting_asks_the_search_to_pause(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in the terminal: the first Ctrl-C pauses the search and the wait goes on until
    the driver has paused it."""
    experiment = api.Experiment.open(make_experiment(db_url, tmp_path / "exp", "running"), db_url)
    before = signal.getsignal(signal.SIGINT)
    driver = threading.Thread(target=_play_driver, args=(db_url, experiment.id, 1, True, before))
    driver.start()
    try:
        state = experiment.wait(timeout=60)
    finally:
        driver.join()
    assert state == ExperimentState.PAUSED
    assert _requested_action(db_url, experiment.id) == "pause"
    assert "Ctrl-C again to stop waiting" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # Python's own handler is back.


def test_a_second_ctrl_c_stops_waiting_and_the_search_still_pauses(
    db_url: str, tmp_path: Path
) -> None:
    experiment = api.Experiment.open(make_experiment(db_url, tmp_path / "exp", "running"), db_url)
    before = signal.getsignal(signal.SIGINT)
    driver = threading.Thread(target=_play_driver, args=(db_url, experiment.id, 2, False, before))
    driver.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            experiment.wait(timeout=60)
    finally:
        driver.join()
    assert _requested_action(db_url, experiment.id) == "pause"


@pytest.mark.slow  # starts a Python process that imports torch
def test_an_importable_trial_class_is_stored_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class given as itself is stored as ``module:Class``, its file's folder the model's."""
    folder = tmp_path / "exp"
    config = yaml.safe_load(write_experiment(folder).read_text())
    # A module name of this test's own: the ranks would import it from its folder by name.
    shutil.copy(EXAMPLES_DIR / "digits" / "model.py", folder / "api_model.py")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)  # not the model folder: the class says where it is
    import api_model  # type: ignore[import-not-found]

    try:
        db = f"sqlite:///{tmp_path / 'search.db'}"
        experiment = api.submit({**config, "entrypoint": api_model.DigitsTrial}, db=db, slots=2)
    finally:
        sys.modules.pop("api_model", None)
    with session_scope(db) as session:
        row = session.get(Experiment, experiment.id)
        assert row is not None
        assert row.config["entrypoint"] == "api_model:DigitsTrial"
        assert row.model_dir == str(folder.resolve()) and row.config_path is None
    assert experiment.state == ExperimentState.ACTIVE  # recorded, not started


def _readme_example() -> str:
    """The Python block of the README's "From Python" section."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## From Python", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_readme_example_runs_a_search_in_the_background(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's notebook: a detached search from a mapping, waited for; then a second
    handle and ``slotsweep list`` see the same experiment."""
    folder = tmp_path / "notebook"
    folder.mkdir()
    for name in ("model.py", "experiment.yaml"):
        shutil.copy(EXAMPLES_DIR / "digits" / name, folder / name)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("SLOTSWEEP_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("SLOTSWEEP_DB", raising=False)
    names: dict[str, Any] = {}
    exec(_readme_example(), names)

    experiment: api.Experiment = names["experiment"]
    assert experiment.state == ExperimentState.COMPLETED
    assert names["trials"]["state"].tolist() == ["COMPLETED"]
    assert (names["trials"]["slot_seconds"] > 0).all()
    assert names["best"].number == 0 and not names["curve"].empty
    assert names["state"]["models"]  # the model's state dict, read weights-only
    assert names["study"].best_trial.number == 0
    db = "sqlite:///" + str(folder / "search.db")
    watcher = api.Experiment.open(experiment.name, db=db)
    assert watcher.id == experiment.id and watcher.wait(timeout=1) == ExperimentState.COMPLETED
    listed = run_cli(["list", "--db", db, "--json"], cli_env, folder)
    assert listed.returncode == 0, listed.stderr
    assert [row["state"] for row in json.loads(listed.stdout)] == ["COMPLETED"]
    assert (tmp_path / "logs" / f"experiment-{experiment.id}" / "driver.log").is_file()
