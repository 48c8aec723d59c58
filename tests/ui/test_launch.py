"""``slotsweep ui``'s server start: no secret on a command line, a token off loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from storage import DB_ENV_VAR
from tests.conftest import REPO_ROOT, free_port
from ui import APP_PATH, streamlit_command
from ui._actions import TOKEN_ENV_VAR
from ui._launch import is_loopback, plan_server

PASSWORD = "S3cretPassw0rd"
QUERY_PASSWORD = "Qu3ryKeyPass"
SECRET_URL = (
    f"postgresql+psycopg://slotsweep:{PASSWORD}@127.0.0.1:1/slotsweep"
    f"?sslpassword={QUERY_PASSWORD}&sslmode=disable"
)
# TEST-NET-1 (RFC 5737): never assigned to a machine, so binding it fails at once and
# the non-loopback path runs for real without a server listening beyond this machine.
UNASSIGNED_ADDRESS = "192.0.2.1"


def test_streamlit_command_runs_the_app_without_a_shell_or_a_url() -> None:
    assert streamlit_command(host="127.0.0.1", port=8600) == [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--client.toolbarMode",  # no "Deploy" button
        "minimal",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        "8600",
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    assert APP_PATH.is_file()


def test_app_reads_the_database_from_its_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ui import _context

    # `streamlit run app.py -- --db URL` would put the URL where `ps` shows it: ignored.
    monkeypatch.setattr(sys, "argv", [str(APP_PATH), "--db", "sqlite:///from-argv.db"])
    monkeypatch.setenv(DB_ENV_VAR, "sqlite:///from-env.db")
    assert _context.db_url() == "sqlite:///from-env.db"
    monkeypatch.delenv(DB_ENV_VAR)
    assert _context.db_url() == "sqlite:///slotsweep.db"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "localhost", "::1"])
def test_loopback_server_needs_no_token_and_gets_the_url_by_environment(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A token left in the caller's environment must not lock a loopback UI.
    monkeypatch.setenv(TOKEN_ENV_VAR, "left-over")
    plan = plan_server(SECRET_URL, host=host, port=8600)
    assert plan.token is None and plan.warning is None
    assert TOKEN_ENV_VAR not in plan.env
    assert plan.env[DB_ENV_VAR] == SECRET_URL
    assert not any(PASSWORD in arg or QUERY_PASSWORD in arg for arg in plan.command)
    assert "?" not in plan.open_url and plan.open_url.endswith(":8600/")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "sweeps.example.org"])
def test_non_loopback_server_warns_and_requires_a_fresh_token(host: str) -> None:
    plan = plan_server(SECRET_URL, host=host, port=8600)
    assert plan.token is not None and len(plan.token) >= 32
    assert plan.env[TOKEN_ENV_VAR] == plan.token
    assert plan.open_url.endswith(f":8600/?token={plan.token}")
    assert plan.warning is not None and "no login" in plan.warning
    assert "\n" not in plan.warning
    for secret in (PASSWORD, QUERY_PASSWORD, plan.token):
        assert not any(secret in arg for arg in plan.command), secret
    assert plan_server(SECRET_URL, host=host).token != plan.token


def test_open_url_names_a_reachable_host() -> None:
    assert plan_server(SECRET_URL, host="0.0.0.0").open_url.startswith(
        f"http://{socket.gethostname()}:8501/?token="
    )
    assert plan_server(SECRET_URL, host="fd00::5").open_url.startswith("http://[fd00::5]:8501/")
    assert plan_server(SECRET_URL, host="::1").open_url == "http://[::1]:8501/"


def test_relative_sqlite_path_reaches_the_server_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DB_ENV_VAR, "sqlite:///sweeps.db")
    assert plan_server(None).env[DB_ENV_VAR] == f"sqlite:///{tmp_path / 'sweeps.db'}"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("LOCALHOST", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("", False),
        ("192.168.1.4", False),
        ("my-laptop", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _start_launch(host: str, port: int, tmp_path: Path) -> subprocess.Popen[str]:
    """``ui.launch`` in a child process, the URL given only in ``$SLOTSWEEP_DB``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)}
    env[DB_ENV_VAR] = SECRET_URL
    env.pop(TOKEN_ENV_VAR, None)
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, ui; sys.exit(ui.launch(None, host=sys.argv[1], port=int(sys.argv[2])))",
            host,
            str(port),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _streamlit_child(launcher: subprocess.Popen[str], timeout_s: float = 60) -> psutil.Process:
    """The Streamlit server ``launcher`` started, once it has exec'd its own program."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if "streamlit" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                continue
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.05)
    raise AssertionError("the Streamlit server did not start")


def _stop(launcher: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM (``launch()`` forwards it to Streamlit), then by PID if it lingers."""
    launcher.send_signal(signal.SIGTERM)
    try:
        return launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # A loaded machine can keep Streamlit's shutdown waiting; what is checked here
        # is the start, so the processes are ended by PID.
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(launcher.pid).children(recursive=True):
                child.kill()
        launcher.kill()
        return launcher.communicate(timeout=30)


@pytest.mark.slow
def test_launched_server_has_the_url_in_its_environment_only(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    launcher = _start_launch("127.0.0.1", port, tmp_path)
    try:
        server = _streamlit_child(launcher)
        for process in [
            psutil.Process(launcher.pid),
            *psutil.Process(launcher.pid).children(True),
        ]:
            argv = " ".join(process.cmdline())
            assert PASSWORD not in argv and QUERY_PASSWORD not in argv, argv
        # What ps shows every user of the machine, read the way ps reads it.
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in cmdline and QUERY_PASSWORD.encode() not in cmdline
        assert server.environ()[DB_ENV_VAR] == SECRET_URL
        assert TOKEN_ENV_VAR not in server.environ()
    finally:
        stdout, stderr = _stop(launcher)
    first = stdout.splitlines()[0]
    assert first == (
        "slotsweep ui: postgresql+psycopg://slotsweep:***@127.0.0.1:1/slotsweep"
        f"?sslmode=disable&sslpassword=*** at http://127.0.0.1:{port}/"
    )
    assert PASSWORD not in stdout + stderr and QUERY_PASSWORD not in stdout + stderr
    assert "warning" not in stderr


@pytest.mark.slow
def test_launch_off_loopback_warns_on_stderr_and_prints_the_token_address(
    tmp_path: Path,
) -> None:
    launcher = _start_launch(UNASSIGNED_ADDRESS, 8600, tmp_path)
    # Streamlit cannot bind the unassigned address and exits; launch() returns its code.
    stdout, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    warning = stderr.splitlines()[0]
    assert warning.startswith(f"slotsweep ui: warning: --host {UNASSIGNED_ADDRESS} is reachable")
    address = stdout.splitlines()[0].rsplit(" at ", 1)[1]
    assert address.startswith(f"http://{UNASSIGNED_ADDRESS}:8600/?token=")
    assert len(address.rsplit("=", 1)[1]) >= 32
    assert PASSWORD not in stdout + stderr and QUERY_PASSWORD not in stdout + stderr


# --- `slotsweep ui`: the searcher checks the database, then runs `python -m ui` ----------


def test_slotsweep_ui_becomes_the_ui_program_with_the_url_in_its_environment(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from searcher import cli
    from ui.__main__ import build_parser

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise SystemExit(0)  # The process would be the UI from here on.

    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setenv(DB_ENV_VAR, db_url)
    with pytest.raises(SystemExit):
        cli.main(["ui", "--host", "::1", "--port", "8600"])
    ((path, argv, env),) = calls
    assert path == sys.executable
    assert argv == [sys.executable, "-m", "ui", "--host=::1", "--port=8600"]
    assert env[DB_ENV_VAR] == db_url and not any(db_url in arg for arg in argv)
    # `python -m ui` reads back what `slotsweep ui` was given.
    args = build_parser().parse_args(argv[3:])
    assert (args.host, args.port) == ("::1", 8600)


def test_slotsweep_ui_refuses_a_database_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from searcher import cli

    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("the UI was started"))
    missing = tmp_path / "absent.db"
    assert cli.main(["ui", "--db", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err.startswith(f"--db: {missing} is not a slotsweep database")
    assert not missing.exists()


def test_ui_program_refuses_a_bad_port_as_slotsweep_ui_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ui.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--port", "0"])
    assert exit_info.value.code == 2
    assert "--port must be an integer from 1 to 65535" in capsys.readouterr().err


@pytest.mark.slow
def test_slotsweep_ui_serves_in_its_own_process(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT), DB_ENV_VAR: db_url}
    env.pop(TOKEN_ENV_VAR, None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "searcher.cli", "ui", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server = _streamlit_child(launcher)
        # The same process, now the UI program: `kill PID` of `slotsweep ui` reaches it.
        ui_program = psutil.Process(launcher.pid)
        assert ui_program.cmdline()[1:] == ["-m", "ui", "--host=127.0.0.1", f"--port={port}"]
        assert server.ppid() == launcher.pid
        assert server.environ()[DB_ENV_VAR] == db_url
        for process in (ui_program, server):
            assert db_url not in " ".join(process.cmdline())
    finally:
        stdout, stderr = _stop(launcher)
    assert stdout.splitlines()[0] == f"slotsweep ui: {db_url} at http://127.0.0.1:{port}/"
    assert "warning" not in stderr
