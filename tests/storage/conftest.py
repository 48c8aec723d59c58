"""A real PostgreSQL server for the storage tests, started and stopped by the project's script."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_SCRIPT, free_port


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """``postgresql://`` URL of a fresh server on 127.0.0.1, stopped by PID afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="slotsweep-pg-"))
    port = free_port()
    started = subprocess.run(
        ["bash", str(POSTGRES_SCRIPT), "start", str(folder), str(port)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if started.returncode != 0:
        pytest.fail(f"PostgreSQL did not start: {started.stderr[-2000:]}")
    try:
        yield f"postgresql://slotsweep@127.0.0.1:{port}/slotsweep"
    finally:
        subprocess.run(
            ["bash", str(POSTGRES_SCRIPT), "stop", str(folder)], check=False, timeout=60
        )
        shutil.rmtree(folder, ignore_errors=True)
