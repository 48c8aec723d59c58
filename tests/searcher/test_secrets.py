"""A PostgreSQL password given only in ``$SLOTSWEEP_DB`` stays there.

A real search on a real PostgreSQL server (trust authentication, so any password is
accepted) runs through the CLI; afterwards the password must appear in no file the
search wrote, no trial log, no command line of any process it started, nothing it
printed, no row of the database and no page of the UI. The trial's spec travels in
the ranks' environment and on the run row (without the URL), never as a file.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy as sa
import streamlit as st
from sqlalchemy.engine import make_url
from streamlit.testing.v1 import AppTest

from storage import DB_ENV_VAR, Trial, TrialRun, redact_url, session_scope
from tests.searcher.conftest import write_experiment
from tests.storage.conftest import postgres_url  # noqa: F401  (a real server)
from tests.ui._pages import RENDER_TIMEOUT_S, PageRenderer, assert_no_exception, texts
from ui import APP_PATH

pytestmark = pytest.mark.slow

PASSWORD = "S3cretPassw0rd"
QUERY_PASSWORD = "Qu3ryS3cretKey"
SECRETS = (PASSWORD, QUERY_PASSWORD)


@pytest.fixture
def secret_url(postgres_url: str) -> str:  # noqa: F811  (the imported fixture)
    """The test server's URL with a password before the @ and another in the query."""
    server = make_url(postgres_url)
    return (
        f"postgresql+psycopg://slotsweep:{PASSWORD}@127.0.0.1:{server.port}/slotsweep"
        f"?sslpassword={QUERY_PASSWORD}"
    )


def _run_watching_command_lines(
    args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 600
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the CLI; also every command line its process tree showed while it ran."""
    process = subprocess.Popen(
        [sys.executable, "-m", "searcher.cli", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    with process:
        while process.poll() is None:
            assert time.monotonic() < deadline, "the search did not finish"
            try:
                tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
            except psutil.NoSuchProcess:
                break
            for member in tree:
                try:
                    seen.add(" ".join(member.cmdline()))
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue
            time.sleep(0.1)
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), seen


def _files_holding_a_secret(*folders: Path) -> list[str]:
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                content = path.read_bytes()
                found += [f"{path}: {s}" for s in SECRETS if s.encode() in content]
    return found


def _database_rows_holding_a_secret(url: str) -> list[str]:
    """Every row of every table (slotsweep's and Optuna's) that holds a secret."""
    engine = sa.create_engine(url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine)
        found = []
        with engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(sa.select(table)):
                    text = repr(tuple(row))
                    found += [f"{table.name}: {s}" for s in SECRETS if s in text]
        return found
    finally:
        engine.dispose()


def test_database_password_appears_nowhere(
    secret_url: str, tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work, logs, checkpoints = tmp_path / "work", tmp_path / "logs", tmp_path / "checkpoints"
    work.mkdir()
    config = write_experiment(
        tmp_path / "exp",
        name="secrets-stay-secret",
        searcher={"max_trials": 1},
        checkpoint_storage={"path": str(checkpoints)},
    )
    env = {**cli_env, DB_ENV_VAR: secret_url, "SLOTSWEEP_LOG_DIR": str(logs)}

    result, command_lines = _run_watching_command_lines(
        ["run", str(config), "--no-progress"], env, work
    )
    assert result.returncode == 0, result.stderr[-4000:]
    described = subprocess.run(
        [sys.executable, "-m", "searcher.cli", "describe", "secrets-stay-secret"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert described.returncode == 0, described.stderr[-2000:]

    # What `ps` showed any user while the search ran: the driver, torchrun, the ranks.
    assert any("torch.distributed.run" in line or "torchrun" in line for line in command_lines)
    assert [line for line in command_lines if any(s in line for s in SECRETS)] == []
    # What the commands printed.
    for output in (result.stdout, result.stderr, described.stdout, described.stderr):
        assert not any(secret in output for secret in SECRETS), output[-2000:]

    # Every file the search wrote: working directory, logs (spec files, trial logs),
    # checkpoints and the experiment's folder; and the trial logs the database names.
    with session_scope(secret_url) as session:
        trial_logs = [Path(p) for p in session.scalars(sa.select(Trial.log_path)) if p]
    assert trial_logs and all(log.is_file() for log in trial_logs)
    assert list(checkpoints.rglob("*")), "the search wrote no checkpoint"
    assert _files_holding_a_secret(work, logs, checkpoints, config.parent) == []
    for log in trial_logs:
        assert not any(s.encode() in log.read_bytes() for s in SECRETS), log

    # The spec reaches the ranks in their environment and is kept on the run row
    # without the database URL; no file carries it.
    assert list(logs.rglob("*.spec.json")) == []
    with session_scope(secret_url) as session:
        specs = [run.spec for run in session.scalars(sa.select(TrialRun))]
    assert specs and all(spec and "db_url" not in spec for spec in specs), specs

    # Nothing the search recorded holds it either.
    assert _database_rows_holding_a_secret(secret_url) == []

    # The UI's pages show the database, never its secrets.
    st.cache_resource.clear()
    st.cache_data.clear()
    monkeypatch.delenv("SLOTSWEEP_CLUSTER", raising=False)
    render = PageRenderer(monkeypatch)
    with session_scope(secret_url) as session:
        trial_id, experiment_id = session.execute(sa.select(Trial.id, Trial.experiment_id)).one()
    redacted = redact_url(secret_url)
    assert redacted.endswith("?sslpassword=***") and ":***@127.0.0.1:" in redacted
    # The sidebar, on the first run only (AppTest drops it from reruns; see tests/ui).
    monkeypatch.setenv(DB_ENV_VAR, secret_url)
    first = AppTest.from_file(str(APP_PATH), default_timeout=RENDER_TIMEOUT_S).run()
    assert first.sidebar.caption[0].value == f"Database: `{redacted}`"
    pages: list[tuple[str, dict[str, Any]]] = [
        ("experiments", {}),
        ("experiment", {"experiment": experiment_id}),
        ("trial", {"trial": trial_id}),
        ("cluster", {}),
    ]
    for page, query in pages:
        app = render(page, secret_url, **query)
        assert_no_exception(app)
        shown = texts(app) + "".join(str(frame.value) for frame in app.dataframe)
        assert not any(secret in shown for secret in SECRETS), (page, shown)
        if page == "experiment":
            assert f"Database: `{redacted}`" in shown
