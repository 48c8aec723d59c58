"""A real PostgreSQL server for the storage tests, started and stopped by the project's script."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """``postgresql://`` URL of a fresh server on 127.0.0.1, stopped by PID afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="slotsweep-pg-"))
    port = _free_port()
    script = REPO_ROOT / ".ci" / "postgres.sh"
    started = subprocess.run(
        ["bash", str(script), "start", str(folder), str(port)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if started.returncode != 0:
        pytest.fail(f"PostgreSQL did not start: {started.stderr[-2000:]}")
    try:
        yield f"postgresql://slotsweep@127.0.0.1:{port}/slotsweep"
    finally:
        subprocess.run(["bash", str(script), "stop", str(folder)], check=False, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
