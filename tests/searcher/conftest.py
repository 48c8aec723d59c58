"""Fixtures for driver and CLI tests: a small copy of the digits example, and the helpers
of the tests that crash searches on purpose (start a driver, wait for a moment in the
database, cut the power, find a trial's processes, judge the database afterwards).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError, ProgrammingError

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    ProcessRole,
    Trial,
    TrialProcess,
    TrialRun,
    session_scope,
)
from tests.conftest import EXAMPLES_DIR
from trials.launch.processes import ProcessRef, is_alive

# Where trials run. Every fault-injection test here runs once per executor that runs
# on this machine's process table, and once more with warm workers. The Slurm executors keep the same promises on a
# real two-node cluster, where faults are Slurm's own (scancel, preemption, a lost
# slurmd) rather than signals to local pids: tests/searcher/test_slurm.py for job
# steps of an allocation (a cancelled step, a lost node, a killed driver and resume),
# tests/searcher/test_slurm_jobs.py for one job per trial (a cancelled job, a
# preempted one, a killed driver and resume).
EXECUTORS = ("local", "local-warm")
#: The executors the fault-injection tests (tests/searcher/driver/test_fault_injection.py)
#: run on: those above, and Ray on the real Ray test cluster (its nodes are network
#: namespaces of this machine, so their processes are in its process table too, and
#: signals to recorded pids are the same faults; a killed driver's Ray actors are
#: checked there too). Its own fault, a lost node, is tests/searcher/test_ray.py.
FAULT_EXECUTORS = (*EXECUTORS, "ray")


def write_experiment(folder: Path, **overrides: Any) -> Path:
    """Copy the digits example into ``folder`` with a small, fast search; return the YAML path.

    ``slow_model.py`` (entrypoint ``slow_model:SlowDigitsTrial``) is copied beside it for
    tests that interrupt trials on purpose.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES_DIR / "digits" / "model.py", folder / "model.py")
    shutil.copy(Path(__file__).parent / "_slow_model.py", folder / "slow_model.py")
    config = yaml.safe_load((EXAMPLES_DIR / "digits" / "experiment.yaml").read_text())
    config["searcher"].update(max_trials=2, max_length={"epochs": 2}, max_concurrent_trials=1)
    config["hyperparameters"]["optimizer"] = {"type": "categorical", "vals": ["sgd", "adamw"]}
    config["min_checkpoint_period"] = {"epochs": 1}
    # Cold unless a test asks for warm workers (the example turns them on), and sizes as
    # given: a size the cluster cannot place is refused (the example shrinks it to fit).
    config["resources"]["reuse_workers"] = False
    config["resources"]["shrink_to_fit"] = False
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searcher.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def experiment_yaml(tmp_path: Path) -> Path:
    return write_experiment(tmp_path / "exp")


@pytest.fixture(params=EXECUTORS)
def executor(request: pytest.FixtureRequest, tmp_path: Path, cli_env: dict[str, str]) -> str:
    """The executor the test's searches run their trials on.

    For ``ray`` (a test parametrized with :data:`FAULT_EXECUTORS`) the Ray test cluster
    is the cluster of every CLI call made with ``cli_env`` (``SLOTSWEEP_CLUSTER``), and
    the search's database must be :func:`executor_database`'s PostgreSQL.
    """
    if request.param == "ray":
        ray_cluster = request.getfixturevalue("ray_cluster")
        cli_env["SLOTSWEEP_CLUSTER"] = str(ray_cluster.cluster_file(tmp_path))
    return str(request.param)


@pytest.fixture
def executor_database(request: pytest.FixtureRequest, executor: str, tmp_path: Path) -> str:
    """The URL of the search's database: SQLite, or PostgreSQL the Ray nodes reach."""
    if executor == "ray":
        return str(request.getfixturevalue("ray_database"))
    return f"sqlite:///{tmp_path / 'sweep.db'}"


def executor_args(executor: str) -> list[str]:
    """The ``slotsweep run|resume`` arguments that select ``executor``.

    The local executor is the default and needs none; each executor added later maps
    to its own arguments here.
    """
    arguments: dict[str, list[str]] = {"local": [], "local-warm": [], "ray": []}
    return list(arguments[executor])


def executor_resources(executor: str) -> dict[str, Any]:
    """The experiment's ``resources`` settings that go with ``executor``.

    ``local-warm`` is the local executor with warm workers (``reuse_workers``): the
    same faults must leave the same promises kept when trials share a job.
    """
    return {"reuse_workers": True} if executor == "local-warm" else {}


def start_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """``slotsweep ARGS --no-progress`` in the background (output captured)."""
    return subprocess.Popen(
        [sys.executable, "-m", "searcher.cli", *args, "--no-progress"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


#: How often :func:`wait_for` asks.
POLL_S = 0.05


def wait_for(predicate: Callable[[], bool], timeout: float = 180, what: str = "") -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The database (SQLite) or its tables (PostgreSQL) may not exist yet while
        # the driver starts.
        with contextlib.suppress(OperationalError, ProgrammingError):
            if predicate():
                return
        # Each poll is a few queries: every 20 ms a waiting test took 5-7 % of a core
        # (SQLite, PostgreSQL and its server), a suite's worth of waits tens of CPU
        # seconds. What is awaited lasts (a moment held open, like a checkpoint's 0.4 s
        # fsync, or a state), so 50 ms is soon enough.
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


def open_runs(db: str, after_id: int = 0) -> list[TrialRun]:
    """Runs not yet ended, newer than run ``after_id``."""
    with session_scope(db) as session:
        return list(
            session.scalars(
                select(TrialRun).where(TrialRun.ended_at.is_(None), TrialRun.id > after_id)
            )
        )


def last_run_id(db: str) -> int:
    with session_scope(db) as session:
        return int(session.scalar(select(func.max(TrialRun.id))) or 0)


def torchrun_pids(db: str, after_id: int = 0) -> list[int]:
    """The torchrun pids of the open runs newer than ``after_id``, as the driver noted them."""
    return [int(node["pid"]) for run in open_runs(db, after_id) for node in run.agents]


def run_to_end(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    """``slotsweep ARGS`` to its end, which must be a success; its output."""
    driver = start_cli(args, env, cwd)
    try:
        out, err = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        out, err = driver.communicate()
        raise AssertionError(f"driver did not finish:\n{out}\n{err}") from None
    assert driver.returncode == 0, f"{out}\n{err}"
    return out + err


def completed_checkpoints(db: str) -> int:
    with session_scope(db) as session:
        return int(
            session.scalar(
                select(func.count()).where(Checkpoint.state == CheckpointState.COMPLETED)
            )
            or 0
        )


def power_loss(driver: subprocess.Popen[str], db: str, after_id: int = 0) -> None:
    """SIGKILL the driver and every process of the trials it started at once.

    Runs left open by an earlier crash are skipped: their pids may belong to others now.
    """
    pids = torchrun_pids(db, after_id)
    driver.kill()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    driver.communicate(timeout=30)


def trial_processes(
    db: str, role: ProcessRole, *, trial_id: int | None = None, attempt: int | None = None
) -> list[TrialProcess]:
    """The recorded processes of one role, optionally of one trial and attempt."""
    query = select(TrialProcess).where(TrialProcess.role == role).order_by(TrialProcess.id)
    if trial_id is not None:
        query = query.where(TrialProcess.trial_id == trial_id)
    if attempt is not None:
        query = query.where(TrialProcess.attempt == attempt)
    with session_scope(db) as session:
        return list(session.scalars(query))


def process_alive(row: TrialProcess) -> bool:
    """Whether the recorded process still runs (a reused pid does not count).

    Asked of this machine whatever host the row names: a test cluster's nodes (network
    namespaces) share its process table.
    """
    return bool(is_alive(ProcessRef("127.0.0.1", row.pid, row.create_time)))


def assert_search_consistent(db: str) -> None:
    """The end of every fault-injection test: the whole database consistent, every trial
    terminal, every experiment COMPLETED."""
    from searcher import check_consistency

    report = check_consistency(db)
    assert report.consistent, "\n".join(report.problems)
    assert report.overlaps == 0
    with session_scope(db) as session:
        states = {e.id: e.state for e in session.scalars(select(Experiment))}
        assert states and set(states.values()) == {ExperimentState.COMPLETED}, states
        unfinished = [
            (t.id, t.state.value)
            for t in session.scalars(select(Trial))
            if not t.state.is_terminal
        ]
        assert not unfinished, unfinished
