"""Helpers shared by the search benchmarks in ``bench/`` (not a public API).

Every benchmark runs real searches through the ``slotsweep`` command line, each on its
own SQLite file in a temporary folder, and reads what happened back from that database.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


def slotsweep_argv() -> list[str]:
    """The ``slotsweep`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "slotsweep"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "searcher.cli"]


def bench_env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment for a search: logs under ``folder``, no inherited DB or cluster."""
    env = dict(os.environ)
    env.pop("SLOTSWEEP_DB", None)
    env.pop("SLOTSWEEP_CLUSTER", None)
    env["SLOTSWEEP_LOG_DIR"] = str(folder / "logs")
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class SearchRun:
    """One ``slotsweep run`` as seen from outside: its wall-clock start and end."""

    db_url: str
    started: float  # time.time() just before the CLI process was started
    ended: float  # time.time() when it exited
    returncode: int
    output: str

    @property
    def wall_s(self) -> float:
        return self.ended - self.started


def run_search(
    config: Path,
    *,
    db_path: Path,
    cwd: Path,
    env: dict[str, str],
    slots: int | None = None,
    timeout_s: float = 1800.0,
) -> SearchRun:
    """``slotsweep run CONFIG --db sqlite:///DB --no-progress [--slots N]``; fails loudly."""
    db_url = f"sqlite:///{db_path}"
    argv = [*slotsweep_argv(), "run", str(config), "--db", db_url, "--no-progress"]
    if slots is not None:
        argv += ["--slots", str(slots)]
    started = time.time()
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout_s,
        check=False,
    )
    ended = time.time()
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{output}")
    return SearchRun(db_url, started, ended, done.returncode, output)


def epoch_s(moment: dt.datetime) -> float:
    """A database timestamp (naive UTC, as ``storage.utcnow`` writes it) in epoch seconds."""
    return moment.replace(tzinfo=dt.timezone.utc).timestamp()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"
