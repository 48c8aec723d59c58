"""Fixtures shared by every test package.

Slow tests (real torchrun jobs, servers, browsers) carry ``@pytest.mark.slow``;
``pytest -m 'not slow'`` is the quick subset.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO_ROOT / "examples"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh SQLite database file, migrated to the newest schema."""
    from storage import upgrade_schema

    url = f"sqlite:///{tmp_path / 'slotsweep.db'}"
    upgrade_schema(url)
    return url


@pytest.fixture
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run the test with the temporary folder as the working directory."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running the ``slotsweep`` CLI as a subprocess."""
    return cli_environment()


def cli_environment() -> dict[str, str]:
    """:func:`cli_env` as a plain function, for session-scoped fixtures."""
    env = dict(os.environ)
    env.pop("SLOTSWEEP_DB", None)
    env.pop("SLOTSWEEP_CLUSTER", None)
    env["PYTHONUNBUFFERED"] = "1"
    # The venv's bin holds torchrun and slotsweep; tests may run from another shell.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
