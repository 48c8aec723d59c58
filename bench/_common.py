"""Helpers shared by the search benchmarks in ``bench/`` (not a public API).

Every benchmark runs real searches through the ``slotsweep`` command line, each on its
own SQLite file in a temporary folder, and reads what happened back from that database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
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


@dataclass(frozen=True)
class SlotHolder:
    """Something that held slots in a search: a warm job, or a trial that ran on none.

    ``until``: a job's end (else its last run's), a trial's end; None where never seen
    to end. ``first_trial``: the job's first trial (the trial itself on no job), whose
    first metric ends the holder's start-up.
    """

    slots: int
    started: dt.datetime | None
    until: dt.datetime | None
    first_trial: int

    def held_s(self, moment: dt.datetime) -> float:
        """Slot-seconds it held up to ``moment``."""
        return self.slots * held_s(self.started, self.until, moment)


def slot_holders(session: Any) -> list[SlotHolder]:
    """Every warm job of the database, and every trial that ran on no warm job.

    A job holds its slots from its start to its end, between its trials too (the
    driver's turn-around, which a cold search spends with the slots free); a trial on no
    job holds its own from its launch to its end.
    """
    from sqlalchemy import select

    from storage import Trial, TrialRun, WarmJob

    jobs = session.execute(
        select(WarmJob.launch_token, WarmJob.started_at, WarmJob.ended_at, WarmJob.slots)
    ).all()
    runs = session.execute(
        select(TrialRun.trial_id, TrialRun.launch_token, TrialRun.ended_at).order_by(TrialRun.id)
    ).all()
    trials = session.execute(
        select(Trial.id, Trial.started_at, Trial.ended_at, Trial.slots_per_trial).where(
            Trial.started_at.is_not(None)
        )
    ).all()
    tokens = {token for token, *_ in jobs}
    on_job: set[int] = set()
    first_trial_on_job: dict[str, int] = {}
    last_run_end: dict[str, dt.datetime] = {}
    for trial_id, token, ended in runs:
        if token not in tokens:
            continue
        on_job.add(trial_id)
        first_trial_on_job.setdefault(token, trial_id)
        if ended is not None:
            last_run_end[token] = max(ended, last_run_end.get(token, ended))
    holders = [
        SlotHolder(
            slots, started, ended or last_run_end.get(token), first_trial_on_job.get(token, -1)
        )
        for token, started, ended, slots in jobs
    ]
    holders += [
        SlotHolder(slots, started, ended, trial_id)
        for trial_id, started, ended, slots in trials
        if trial_id not in on_job
    ]
    return holders


def held_s(started: dt.datetime | None, ended: dt.datetime | None, moment: dt.datetime) -> float:
    """Seconds from ``started`` to ``ended`` or ``moment``, whichever comes first."""
    until = min(moment, ended) if ended is not None else moment
    if started is None or until == dt.datetime.max:
        return 0.0  # never reached and still running: nothing to count it to
    return max(0.0, (until - started).total_seconds())


def bootstrap_interval(
    pairs: Sequence[tuple[float, float]],
    *,
    level: float = 0.9,
    resamples: int = 10_000,
    rng_seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``median(b) / median(a)`` over seeds drawn with replacement.

    ``pairs`` holds one ``(a, b)`` per seed (the baseline's and the other arm's
    compute); a seed is resampled as a pair, since both arms share its first random
    draws. The spread says how much the median ratio of this many seeds moves with the
    seeds chosen, which is what decides whether a run says anything about a threshold.

    Example:
        >>> lo, hi = bootstrap_interval([(100.0, 30.0)] * 5)
        >>> (lo, hi)
        (0.3, 0.3)
    """
    rng = random.Random(rng_seed)
    ratios = []
    for _ in range(resamples):
        sample = rng.choices(pairs, k=len(pairs))
        ratios.append(median([b for _, b in sample]) / median([a for a, _ in sample]))
    ratios.sort()
    tail = (1.0 - level) / 2.0
    low = ratios[round(tail * (resamples - 1))]
    high = ratios[round((1.0 - tail) * (resamples - 1))]
    return low, high
