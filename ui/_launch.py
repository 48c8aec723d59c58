"""Start the Streamlit app as a child process (what ``slotsweep ui`` runs).

The database URL reaches the server through its environment (``$SLOTSWEEP_DB``), not
its command line: any user of the machine can read a process's argv (``ps``), while
its environment is readable by its owner only. The same holds for the control token
a non-loopback server gets (see :mod:`ui._actions`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from storage import DB_ENV_VAR, absolute_db_url, redact_url, resolve_db_url
from ui._actions import TOKEN_ENV_VAR, TOKEN_QUERY_PARAM, new_token

APP_PATH = Path(__file__).resolve().parent / "app.py"
# Addresses that mean "every interface": the URL to open names this machine instead.
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    """How ``slotsweep ui`` starts the server, decided before anything starts.

    Attributes:
        command: Streamlit's argv; it holds no database URL and no token.
        env: The server's environment: the caller's, plus the URL (and the token).
        open_url: The address to open in a browser, ``?token=...`` included if any.
        token: The token the control actions need, ``None`` on a loopback address.
        warning: The line to print on stderr before serving, ``None`` on loopback.
    """

    command: list[str]
    env: dict[str, str]
    open_url: str
    token: str | None
    warning: str | None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only.

    Host names other than ``localhost`` count as reachable from elsewhere: resolving
    them here would not say what the name means to the machine's other users.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def streamlit_command(
    *, host: str = "127.0.0.1", port: int = 8501, headless: bool = True
) -> list[str]:
    """The argv that serves the app; the app reads its database from ``$SLOTSWEEP_DB``.

    Example:
        >>> streamlit_command(port=8600)[-6:-2]
        ['--server.port', '8600', '--server.headless', 'true']
    """
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        # "minimal": no "Deploy" button (this is a local tool, not a Streamlit Cloud app).
        "--client.toolbarMode",
        "minimal",
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
    ]


def streamlit_environment(
    db_url: str, token: str | None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The server's environment: ``base`` (default: ours) with the URL and the token set.

    A token inherited from ``base`` is dropped when ``token`` is ``None``, so a
    loopback server never asks for one that nobody printed.

    Example:
        >>> env = streamlit_environment("sqlite:////x.db", None, base={"SLOTSWEEP_UI_TOKEN": "t"})
        >>> env
        {'SLOTSWEEP_DB': 'sqlite:////x.db'}
    """
    env = dict(os.environ if base is None else base)
    env[DB_ENV_VAR] = db_url
    env.pop(TOKEN_ENV_VAR, None)
    if token is not None:
        env[TOKEN_ENV_VAR] = token
    return env


def plan_server(
    db_url: str | None, *, host: str = "127.0.0.1", port: int = 8501, headless: bool = True
) -> ServerPlan:
    """Everything :func:`launch` needs, without starting anything (so it can be tested).

    A relative SQLite path is made absolute so it means the same file whatever
    Streamlit's directory. A non-loopback ``host`` gets a fresh token and a warning.

    Example:
        >>> plan = plan_server("sqlite:////tmp/x.db", host="0.0.0.0", port=8600)
        >>> plan.token is not None and plan.open_url.endswith(f"?token={plan.token}")
        True
    """
    url = absolute_db_url(resolve_db_url(db_url))
    token = None if is_loopback(host) else new_token()
    open_url = f"http://{_browser_host(host)}:{port}/"
    warning = None
    if token is not None:
        open_url += f"?{TOKEN_QUERY_PARAM}={token}"
        warning = (
            f"slotsweep ui: warning: --host {host or '(all interfaces)'} is reachable from "
            "other machines and the UI has no login: anyone there sees every experiment; "
            "pause and kill work only on pages opened with the token in the address below"
        )
    return ServerPlan(
        command=streamlit_command(host=host, port=port, headless=headless),
        env=streamlit_environment(url, token),
        open_url=open_url,
        token=token,
        warning=warning,
    )


def _browser_host(host: str) -> str:
    """``host`` as it goes in a URL: this machine's name for a wildcard, IPv6 in brackets."""
    if host in _WILDCARD_HOSTS:
        return socket.gethostname()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def launch(
    db_url: str | None, *, host: str = "127.0.0.1", port: int = 8501, headless: bool = True
) -> int:
    """Serve the UI for ``db_url`` until the server stops; returns Streamlit's exit code.

    Bound to 127.0.0.1 unless told otherwise: the UI has no login. On any other
    address a warning goes to stderr and the pause and kill controls need the token
    printed in the address to open (see :func:`plan_server`).

    It runs until the server stops, so no example runs it here::

        launch("sqlite:///slotsweep.db", port=8502)
    """
    plan = plan_server(db_url, host=host, port=port, headless=headless)
    if plan.warning is not None:
        print(plan.warning, file=sys.stderr, flush=True)
    print(f"slotsweep ui: {redact_url(plan.env[DB_ENV_VAR])} at {plan.open_url}", flush=True)
    # `kill PID` of `slotsweep ui` must stop the server too, not orphan it: the handler
    # is in place before the server starts, and a signal that comes while it starts is
    # passed on once it has (a loaded machine showed that window: the server orphaned).
    process: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if process is not None:
            process.send_signal(signum)
        else:
            pending.append(signum)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, forward)
    try:
        process = subprocess.Popen(plan.command, env=plan.env)
        for signum in pending:
            process.send_signal(signum)
        return process.wait()
    except KeyboardInterrupt:
        if process is None:
            raise
        # Ctrl-C reaches the whole process group; let Streamlit finish shutting down.
        return process.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
