"""Helpers shared by the search benchmarks in ``bench/`` (not a public API).

Every benchmark runs real searches through the ``slotsweep`` command line, each on its
own SQLite file in a temporary folder, and reads what happened back from that database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
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


@contextlib.contextmanager
def scratch_folder(prefix: str, *, keep: bool) -> Iterator[Path]:
    """A temporary folder for a benchmark's searches, removed afterwards unless ``keep``."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class SearchRun:
    """One ``slotsweep run`` as seen from outside."""

    db_url: str
    started: float  # time.time() just before the CLI process was started
    ended: float  # time.time() when it exited
    output: str
    # (time.time(), CPU seconds the driver process itself had used, CPU seconds of its
    # children it had reaped: the trials' torchrun trees), sampled while it ran.
    driver_cpu: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.ended - self.started

    def driver_cpu_between(self, start: float, end: float) -> float:
        """CPU seconds the driver used between two wall-clock moments (nearest samples)."""
        if not self.driver_cpu:
            return float("nan")

        def at(moment: float) -> float:
            return min(self.driver_cpu, key=lambda s: abs(s[0] - moment))[1]

        return at(end) - at(start)

    @property
    def reaped_children_cpu(self) -> float:
        """CPU seconds of the children the driver had reaped at its last sample."""
        return self.driver_cpu[-1][2] if self.driver_cpu else float("nan")


def run_search(
    config: Path,
    *,
    db_path: Path | None = None,
    db_url: str | None = None,
    cwd: Path,
    env: dict[str, str],
    slots: int | None = None,
    poll_s: float = 0.1,
    on_poll: Callable[[str], None] | None = None,
    timeout_s: float = 1800.0,
) -> SearchRun:
    """``slotsweep run CONFIG --db URL --no-progress [--slots N]``; fails loudly.

    The database is the SQLite file ``db_path``, or ``db_url`` (e.g. PostgreSQL, which
    a search whose ranks run on other nodes needs); give exactly one. Every ``poll_s``
    the driver's own CPU time is sampled and ``on_poll(db_url)`` is called (a benchmark
    may stop the search from there).
    """
    import psutil

    if (db_path is None) == (db_url is None):
        raise ValueError("run_search: give exactly one of db_path and db_url")
    db_url = db_url if db_url is not None else f"sqlite:///{db_path}"
    argv = [*slotsweep_argv(), "run", str(config), "--db", db_url, "--no-progress"]
    if slots is not None:
        argv += ["--slots", str(slots)]
    samples: list[tuple[float, float, float]] = []
    with tempfile.TemporaryFile() as out:
        started = time.time()
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            watched = psutil.Process(process.pid)
            while process.poll() is None:
                if time.time() - started > timeout_s:
                    raise TimeoutError(f"{' '.join(argv)} ran longer than {timeout_s} s")
                with contextlib.suppress(psutil.Error):
                    cpu = watched.cpu_times()
                    samples.append(
                        (
                            time.time(),
                            cpu.user + cpu.system,
                            cpu.children_user + cpu.children_system,
                        )
                    )
                if on_poll is not None:
                    on_poll(db_url)
                time.sleep(poll_s)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
        ended = time.time()
        out.seek(0)
        output = out.read().decode(errors="replace")
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{output[-4000:]}")
    return SearchRun(db_url, started, ended, output, samples)


def epoch_s(moment: dt.datetime) -> float:
    """A database timestamp (naive UTC, as ``storage.utcnow`` writes it) in epoch seconds."""
    return moment.replace(tzinfo=dt.timezone.utc).timestamp()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}f}"
