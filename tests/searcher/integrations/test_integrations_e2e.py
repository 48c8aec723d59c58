"""One small real search, logged by its driver to a real MLflow server and posting to a
local webhook, then exported again with ``slotsweep export mlflow`` and served by a real
TensorBoard (``slotsweep tensorboard``): each read back with the tool's own client.

The MLflow server (``mlflow server``, SQLite backend, 127.0.0.1) and the search are built
once for this module (~35 s); every test here reads them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from searcher.cli import main
from storage import Metric, MetricKind, Trial, session_scope
from tests.conftest import cli_environment, free_port
from tests.searcher.conftest import run_cli, write_experiment
from tests.searcher.integrations.test_integrations import _Recorder

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("integrations-search")]

SERVER_START_S = 90.0


def _stop_group(process: subprocess.Popen[Any]) -> None:
    """End a server started in its own session: SIGTERM to its group, SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # The server's workers share its group: none may outlive it.
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def _alive_with(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process running ``marker`` (not a zombie, not a reused pid)."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and marker in " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return False


def _describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return f"{pid}: {process.status()} ppid {process.ppid()} {process.cmdline()}"
    except psutil.NoSuchProcess:
        return f"{pid}: gone"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait_for(url: str, process: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while True:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on 127.0.0.1 with a SQLite backend; its URI."""
    # Imported here, not at collection: MLflow takes seconds to import.
    pytest.importorskip("mlflow")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = folder / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"),
                *("--port", str(port), "--workers", "1"),
                *("--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"),
                *("--default-artifact-root", str(folder / "artifacts")),
            ],
            # Its job runner needs a package the client does not: no jobs here.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(f"http://127.0.0.1:{port}/health", server, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop_group(server)


@dataclass(frozen=True)
class LoggedSearch:
    db_url: str
    experiment_id: int
    folder: Path
    #: What the webhook received while the search ran.
    posted: list[tuple[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def logged_search(
    mlflow_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoggedSearch]:
    """The digits search (2 trials) with ``integrations.mlflow`` and a webhook, finished."""
    folder = tmp_path_factory.mktemp("logged_search")
    hook = _Recorder()
    try:
        path = write_experiment(
            folder / "exp",
            integrations={
                "mlflow": {"tracking_uri": mlflow_server, "experiment_name": "driver-logged"}
            },
            notifications=[{"url": hook.url, "on": ["completed", "trial_failed"]}],
            # Both trials at once, one slot each: the search's time is one trial's.
            resources={"slots_per_trial": 1},
            searcher={"max_concurrent_trials": 2},
        )
        db_url = f"sqlite:///{folder / 'search.db'}"
        env = {**cli_environment(), "SLOTSWEEP_LOG_DIR": str(folder / "logs")}
        done = run_cli(
            ["run", str(path), "--db", db_url, "--slots", "2", "--no-progress"], env, folder
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "View run" not in done.stdout  # MLflow's own prints stay out of the summary
        yield LoggedSearch(db_url, 1, folder, list(hook.received))
    finally:
        hook.close()


def _db_trials(search: LoggedSearch) -> dict[str, dict[str, Any]]:
    """Each trial by label: state, hyperparameters as MLflow keeps params, val_loss steps."""
    with session_scope(search.db_url) as session:
        trials = {}
        for trial in session.scalars(select(Trial).order_by(Trial.optuna_trial_number)):
            steps = session.scalars(
                select(Metric.step)
                .where(
                    Metric.trial_id == trial.id,
                    Metric.kind == MetricKind.VALIDATION,
                    Metric.name == "val_loss",
                )
                .order_by(Metric.step)
            ).all()
            trials[f"1.{trial.optuna_trial_number}"] = {
                "state": trial.state.value,
                "params": {k: str(v) for k, v in trial.hparams.items()},
                "val_loss_steps": list(steps),
            }
        return trials


def _mlflow_trials(uri: str, experiment_name: str) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The parent run and each trial's run (by label) of an MLflow experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if "slotsweep.trial_id" not in r.data.tags]
    trials = {}
    for run in runs:
        tags = run.data.tags
        if "slotsweep.trial_id" not in tags:
            continue
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert "slotsweep describe 1" in tags["mlflow.note.content"]
        history = client.get_metric_history(run.info.run_id, "validation/val_loss")
        trials[tags["slotsweep.trial"]] = {
            "state": tags["slotsweep.state"],
            "params": run.data.params,
            "val_loss_steps": sorted(m.step for m in history),
            "status": run.info.status,
        }
    return parent, trials


def test_the_driver_logged_every_trial_to_mlflow_nested_under_the_search(
    logged_search: LoggedSearch, mlflow_server: str
) -> None:
    parent, trials = _mlflow_trials(mlflow_server, "driver-logged")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["slotsweep.state"] == "COMPLETED"
    assert "best/val_loss" in parent.data.metrics
    expected = _db_trials(logged_search)
    assert {label: {k: t[k] for k in expected[label]} for label, t in trials.items()} == expected
    assert all(t["status"] == "FINISHED" for t in trials.values())  # COMPLETED or PRUNED

    (completed,) = [body for _, body in logged_search.posted if body["event"] == "completed"]
    assert completed["state"] == "COMPLETED" and completed["counts"]["total"] == 2
    assert completed["best_value"] == pytest.approx(parent.data.metrics["best/val_loss"])


def test_export_mlflow_logs_a_finished_search_once(
    logged_search: LoggedSearch, mlflow_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export", "mlflow", "1", "--db", logged_search.db_url]
    args += ["--tracking-uri", mlflow_server, "--experiment-name", "exported"]
    assert main(args) == 0
    assert main(args) == 0  # again: nothing is logged twice
    _, exported = _mlflow_trials(mlflow_server, "exported")
    _, logged = _mlflow_trials(mlflow_server, "driver-logged")
    assert exported == logged
    assert "exported to MLflow" in capsys.readouterr().out


def test_tensorboard_serves_the_search_and_stops_with_the_command(
    logged_search: LoggedSearch, tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    port = free_port()
    env = {**cli_environment(), "SLOTSWEEP_LOG_DIR": str(tmp_path / "logs")}
    log = tmp_path / "tensorboard.log"
    with log.open("wb") as out:
        command = subprocess.Popen(
            [
                *(sys.executable, "-m", "searcher.cli", "tensorboard", "1"),
                *("--db", logged_search.db_url, "--port", str(port)),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(f"{base}/data/runs", command, log)
        deadline = time.monotonic() + 30
        while sorted(_get(f"{base}/data/runs")) != [".", "trial-0", "trial-1"]:
            assert time.monotonic() < deadline, _get(f"{base}/data/runs")
            time.sleep(0.3)
        tags = _get(f"{base}/data/plugin/scalars/tags")
        for run in ("trial-0", "trial-1"):
            assert {"training/loss", "validation/val_loss"} <= set(tags[run])
            assert any(t.startswith("timings/") for t in tags[run])
            assert any(t.startswith("system/") for t in tags[run])
        board_pid = int(log.read_text().split("(pid ")[1].split(")")[0])
    finally:
        command.send_signal(signal.SIGTERM)  # by its PID: it stops TensorBoard and exits
        assert command.wait(30) == 0, log.read_text()[-3000:]
        _stop_group(command)
    assert not _alive_with(board_pid, "tensorboard.main"), _describe(board_pid)
    steps = _db_trials(logged_search)["1.0"]["val_loss_steps"]
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    files = EventMultiplexer()
    files.AddRunsFromDirectory(str(tmp_path / "logs" / "experiment-1" / "tensorboard"))
    files.Reload()
    assert [e.step for e in files.GetAccumulator("trial-0").Scalars("validation/val_loss")] == (
        steps
    )
