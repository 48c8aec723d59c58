"""The integrations without a search: the config's fields, the webhooks (a server that
records, one that is down, one that answers 500), the driver's background thread, the
TensorBoard files appended to, and the missing extras named in one line.

A real search logged to a real MLflow server and served by a real TensorBoard is
tests/searcher/integrations/test_integrations_e2e.py.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import searcher.integrations.driver_side as driver_side
from searcher.experiments import UsageError
from searcher.integrations import (
    DriverIntegrations,
    Poster,
    TensorBoardExport,
    integration_problem,
    require,
)
from searcher.submit.creation import create_experiment
from searcher.submit.submission import validate_run
from storage import Experiment as ExperimentRow
from storage import (
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    TrialState,
    session_scope,
    utcnow,
)
from tests.conftest import free_port
from tests.searcher.conftest import write_experiment
from trials.config import ConfigError, NotificationConfig, load_config, parse_config
from trials.executors import parse_cluster

_POOL = {"resource_pools": [{"name": "default", "agents": [{"name": "a1", "slots": 2}]}]}


# ---------------------------------------------------------------------- servers
class _Recorder:
    """A local HTTP server that answers ``status`` and keeps every JSON body posted."""

    def __init__(self, status: int = 200) -> None:
        received: list[tuple[str, dict[str, Any]]] = []
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                received.append((self.path, json.loads(self.rfile.read(length))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    yield server
    server.close()


@pytest.fixture
def failing() -> Iterator[_Recorder]:
    server = _Recorder(status=500)
    yield server
    server.close()


def _down_url() -> str:
    """A URL on a port nothing listens on (bound, never listened: connection refused)."""
    return f"http://127.0.0.1:{free_port()}/down"


@pytest.fixture(autouse=True)
def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_side, "POLL_S", 0.1)
    monkeypatch.setattr("searcher.integrations.notifications.FIRST_BACKOFF_S", 0.05)


# ---------------------------------------------------------------------- config
def _raw_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(write_experiment(tmp_path / "exp").read_text())
    raw.update(extra)
    return raw


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"integrations": {"mlflow": {"tracking_uri": "ftp://x"}}},
            "integrations.mlflow.tracking_uri: must be a URI with one of the schemes",
        ),
        (
            {"integrations": {"mlflow": {"tracking_uri": "http://me:pw@mlflow:5000"}}},
            "integrations.mlflow.tracking_uri: credentials in the URL are refused",
        ),
        ({"integrations": {"mlfow": {}}}, "integrations.mlfow: unknown field; allowed: mlflow"),
        ({"notifications": [{"url": "hooks.example.com"}]}, "notifications.0.url: must be an"),
        (
            {"notifications": [{"url": "https://a:b@hooks.example.com/x"}]},
            "notifications.0.url: credentials in the URL are refused",
        ),
        ({"notifications": [{"url": "http://h/x", "on": ["done"]}]}, "notifications.0.on.0:"),
    ],
)
def test_integration_fields_are_validated_in_one_line_each(
    tmp_path: Path, extra: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(_raw_config(tmp_path, **extra))
    assert len(raised.value.problems) == 1, raised.value.problems
    assert raised.value.problems[0].startswith(expected), raised.value.problems
    assert "pw" not in raised.value.problems[0] and ":b@" not in raised.value.problems[0]


def test_a_bad_integration_exits_2_from_the_cli(tmp_path: Path) -> None:
    from searcher.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(_raw_config(tmp_path, integrations={"mlflow": {"tracking_uri": "x"}}))
    )
    (tmp_path / "model.py").write_text("")
    assert main(["run", str(path), "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"]) == 2
    assert not (tmp_path / "db.sqlite").exists()


def test_the_cluster_file_takes_notifications_for_every_search() -> None:
    cluster = parse_cluster(
        {**_POOL, "notifications": [{"url": "https://hooks.slack.com/services/T/B/x"}]}
    )
    (target,) = cluster.notifications
    assert target.is_slack and target.on == ["completed", "error"]
    with pytest.raises(Exception, match=r"notifications\.0\.on\.0"):
        parse_cluster({**_POOL, "notifications": [{"url": "http://h/x", "on": ["never"]}]})


# ---------------------------------------------------------------------- missing extras
def test_a_missing_extra_is_named_with_its_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UsageError, match=r"^nope is not installed: pip install 'slotsweep\[x\]'$"):
        require("nope.sub", extra="x")
    config = parse_config(
        _raw_config(tmp_path, integrations={"mlflow": {"tracking_uri": "http://127.0.0.1:1"}})
    )
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert integration_problem(config) == (
        "integrations.mlflow: mlflow is not installed: pip install 'slotsweep[mlflow]'"
    )
    with pytest.raises(UsageError, match=r"pip install 'slotsweep\[mlflow\]'"):
        validate_run(config, parse_cluster(_POOL), f"sqlite:///{tmp_path / 'x.db'}")


def test_tensorboard_without_its_extra_exits_2_in_one_line(
    tmp_path: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from searcher.cli import main

    _experiment(tmp_path, db_url)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    assert main(["tensorboard", "1", "--db", db_url, "--logdir", str(tmp_path / "tb")]) == 2
    assert capsys.readouterr().err == (
        "tensorboard is not installed: pip install 'slotsweep[tensorboard]'\n"
    )
    assert not (tmp_path / "tb").exists()


# ---------------------------------------------------------------------- webhooks
def test_a_webhook_is_retried_and_a_dead_one_never_holds_the_caller(
    recorder: _Recorder, failing: _Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    poster = Poster(attempts=3, first_backoff_s=0.05)
    body = {"experiment": {"id": 1, "name": "x"}, "event": "completed"}
    for url in (_down_url(), failing.url, recorder.url):
        poster.send(NotificationConfig(url=url, on=["completed"]), body)
    assert poster.close(timeout=10.0)
    assert recorder.received == [("/hook", body)]
    assert len(failing.received) == 3  # every try reached it
    failures = [r.getMessage() for r in caplog.records if "failed after 3 tries" in r.getMessage()]
    assert len(failures) == 2, failures  # once per URL: the one down and the one answering 500
    assert any("HTTP 500" in line for line in failures)
    assert not any("/down" in line or "/hook" in line for line in failures)  # hosts only


# ---------------------------------------------------------------------- the driver's thread
def _experiment(tmp_path: Path, db_url: str, **extra: Any) -> tuple[int, Any]:
    path = write_experiment(tmp_path / "exp", **extra)
    config = load_config(path)
    experiment_id = create_experiment(
        config, config_path=path, db_url=db_url, directions=["minimize"]
    )
    return experiment_id, config


def _add_trial(db_url: str, experiment_id: int, number: int, **fields: Any) -> int:
    with session_scope(db_url) as session:
        trial = Trial(
            **{
                "experiment_id": experiment_id,
                "optuna_trial_id": number,
                "optuna_trial_number": number,
                "state": TrialState.RUNNING,
                "hparams": {"lr": 0.1, "optimizer": "sgd", "layers": [1, 2]},
                "slots_per_trial": 1,
                "started_at": utcnow(),
                **fields,
            }
        )
        session.add(trial)
        session.flush()
        return trial.id


def _set(db_url: str, model: Any, row_id: int, **fields: Any) -> None:
    with session_scope(db_url) as session:
        row = session.get(model, row_id)
        for name, value in fields.items():
            setattr(row, name, value)


def test_the_driver_thread_posts_failed_trials_and_the_end(
    tmp_path: Path, db_url: str, recorder: _Recorder, failing: _Recorder
) -> None:
    experiment_id, config = _experiment(
        tmp_path,
        db_url,
        notifications=[
            {"url": recorder.url, "on": ["trial_failed", "completed"]},
            {"url": failing.url, "on": ["paused"]},  # not an event of this search
        ],
    )
    _add_trial(db_url, experiment_id, 0, state=TrialState.ERROR, error="failed before")
    failed = _add_trial(db_url, experiment_id, 1)
    slack = NotificationConfig(url="https://hooks.slack.com/services/T/B/x", on=["error"])
    integrations = DriverIntegrations(db_url, experiment_id, config, cluster_notifications=[slack])
    integrations.start()
    try:
        _wait(lambda: integrations._known_failed is not None)
        _set(db_url, Trial, failed, state=TrialState.ERROR, error="RuntimeError: boom\nTraceback")
        _wait(lambda: len(recorder.received) == 1)
        _set(db_url, ExperimentRow, experiment_id, state=ExperimentState.COMPLETED)
        integrations.search_ended("COMPLETED", "2 trials: 0 completed, 0 pruned, 2 failed")
    finally:
        assert integrations.close(timeout=10.0)
    (_, trial_failed), (_, completed) = recorder.received
    assert trial_failed["event"] == "trial_failed" and trial_failed["trial"] == "1.1"
    assert trial_failed["reason"] == "RuntimeError: boom"  # one line; the earlier failure not sent
    assert trial_failed["state"] == "ACTIVE"
    assert completed == {
        "experiment": {"id": experiment_id, "name": config.name},
        "event": "completed",
        "state": "COMPLETED",
        "counts": {
            "total": 2,
            "queued": 0,
            "running": 0,
            "completed": 0,
            "pruned": 0,
            "errored": 2,
            "not_run": 0,
        },
        "metric": "val_loss",
        "best_value": None,
        "reason": "2 trials: 0 completed, 0 pruned, 2 failed",
    }
    assert failing.received == []
    assert "sqlite" not in json.dumps(recorder.received)  # nothing names the database


def test_nothing_configured_starts_no_thread(tmp_path: Path, db_url: str) -> None:
    experiment_id, config = _experiment(tmp_path, db_url)
    integrations = DriverIntegrations(db_url, experiment_id, config, cluster_notifications=())
    before = threading.active_count()
    integrations.start()
    assert not integrations.active and threading.active_count() == before
    assert integrations.close(timeout=0.0)


def test_an_unreachable_mlflow_never_slows_the_driver_and_is_logged_once(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("mlflow")
    down = f"http://127.0.0.1:{free_port()}"
    experiment_id, config = _experiment(
        tmp_path, db_url, integrations={"mlflow": {"tracking_uri": down}}
    )
    _add_trial(db_url, experiment_id, 0)
    integrations = DriverIntegrations(db_url, experiment_id, config, cluster_notifications=())
    integrations.start()
    _wait(lambda: integrations._mlflow_failing, timeout=60.0)
    _set(db_url, ExperimentRow, experiment_id, state=ExperimentState.COMPLETED)
    integrations.search_ended("COMPLETED", "done")
    assert not integrations.close(timeout=0.5)  # the driver is not held past its bound
    warnings = [r.getMessage() for r in caplog.records if down in r.getMessage()]
    assert sum("retrying in the background" in w for w in warnings) == 1, warnings
    assert any(f"slotsweep export mlflow {experiment_id}" in w for w in warnings)


# ---------------------------------------------------------------------- TensorBoard files
def test_tensorboard_files_are_appended_never_rewritten(tmp_path: Path, db_url: str) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    experiment_id, _ = _experiment(tmp_path, db_url)
    trial = _add_trial(db_url, experiment_id, 0)
    logdir = tmp_path / "tb"

    def record(steps: range) -> None:
        with session_scope(db_url) as session:
            for step in steps:
                session.add(
                    Metric(trial_id=trial, step=step, kind=MetricKind.TRAINING, name="loss",
                           value=1.0 / (step + 1), epoch=None)
                )  # fmt: skip

    record(range(1, 4))
    first = TensorBoardExport(db_url, experiment_id, logdir)
    assert first.write() == 3
    first.close()
    hashes = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in logdir.rglob("events.*")}
    record(range(4, 6))
    _set(db_url, Trial, trial, state=TrialState.COMPLETED, ended_at=utcnow())
    second = TensorBoardExport(db_url, experiment_id, logdir)  # a later command, say
    assert second.write() == 2
    assert second.write() == 0
    second.close()
    for path, digest in hashes.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, path

    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(logdir))
    runs.Reload()
    loss = runs.GetAccumulator("trial-0").Scalars("training/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5]
    assert loss[-1].value == pytest.approx(1 / 6)
    hparams = runs.PluginRunToTagToContent("hparams")
    assert set(hparams["."]) == {"_hparams_/experiment"}
    assert set(hparams["trial-0"]) == {
        "_hparams_/session_start_info",
        "_hparams_/session_end_info",
    }

    other = tmp_path / "other"
    other.mkdir()
    (other / ".slotsweep-export.json").write_text(json.dumps({"experiment_id": 99}))
    with pytest.raises(UsageError, match="holds experiment 99"):
        TensorBoardExport(db_url, experiment_id, other)


def _wait(condition: Any, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_free_port_is_refused(tmp_path: Path) -> None:
    """What _down_url relies on: nothing listens on a port free_port returned."""
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", free_port()))
