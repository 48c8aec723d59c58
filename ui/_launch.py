"""Start the Streamlit app as a child process (what ``slotsweep ui`` runs)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from storage import absolute_db_url, redact_url, resolve_db_url

APP_PATH = Path(__file__).resolve().parent / "app.py"


def streamlit_command(
    db_url: str, *, host: str = "127.0.0.1", port: int = 8501, headless: bool = True
) -> list[str]:
    """The argv that serves the app; the database URL goes after ``--`` to the app itself.

    Example:
        >>> streamlit_command("sqlite:////tmp/x.db", port=8600)[-2:]
        ['--db', 'sqlite:////tmp/x.db']
    """
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--",
        "--db",
        db_url,
    ]


def launch(
    db_url: str, *, host: str = "127.0.0.1", port: int = 8501, headless: bool = True
) -> int:
    """Serve the UI for ``db_url`` until the server stops; returns Streamlit's exit code.

    Bound to 127.0.0.1 unless told otherwise: the UI has no login. A relative SQLite
    path is made absolute so it means the same file whatever Streamlit's directory.

    Example:
        >>> launch("sqlite:///slotsweep.db", port=8502)  # doctest: +SKIP
        0
    """
    url = absolute_db_url(resolve_db_url(db_url))
    command = streamlit_command(url, host=host, port=port, headless=headless)
    print(f"slotsweep ui: {redact_url(url)} at http://{host}:{port}", flush=True)
    process = subprocess.Popen(command)
    # `kill PID` of `slotsweep ui` must stop the server too, not orphan it.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(
            signal.SIGTERM, lambda signum, _frame: process.send_signal(signum)
        )
    try:
        return process.wait()
    except KeyboardInterrupt:
        # Ctrl-C reaches the whole process group; let Streamlit finish shutting down.
        return process.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
