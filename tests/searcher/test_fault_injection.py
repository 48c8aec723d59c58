"""Fault injection: kill or hang the parts of a running search, then judge the whole database.

Each test runs real searches through the CLI, injects one kind of fault (the driver
SIGKILLed at random moments, a trial's ``torchrun`` SIGKILLed, one rank SIGKILLed, one
rank hung), lets the search finish, and ends with the same verdict
(:func:`tests.searcher.conftest.assert_search_consistent`): the consistency check finds
nothing (every finished trial kept, no metric recorded twice, no restart from step 0
past a checkpoint, no two attempts of a trial overlapping, no slot held by two trials),
every trial is terminal and the experiment COMPLETED.

Every test takes the ``executor`` fixture, so each executor added later must pass them
all. The processes to kill are found as a later driver would find them: from their
``slotsweep_trial_processes`` rows (pid and kernel start time).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage import (
    Checkpoint,
    ProcessRole,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    executor_args,
    process_alive,
    run_cli,
    start_cli,
    trial_processes,
    wait_for,
    write_experiment,
)

pytestmark = pytest.mark.slow

# Driver kills happen at moments drawn from this seed, so a failure can be replayed.
KILL_SEED = 13
DRIVER_KILLS = 10
# How long the ranks of a killed torchrun may outlive it.
RANKS_GONE_WITHIN_S = 5.0


def _experiment(folder: Path, **overrides: Any) -> Path:
    """The slow digits trial at a fixed batch size: about 2 s an epoch, a checkpoint each."""
    settings: dict[str, Any] = {
        "entrypoint": "slow_model:SlowDigitsTrial",
        "hyperparameters": {"global_batch_size": 64},
        "data": {"batch_delay_s": 0.08},
        "min_checkpoint_period": {"epochs": 1},
    }
    return write_experiment(folder, **{**settings, **overrides})


def _single_trial(folder: Path, **overrides: Any) -> Path:
    """One 2-slot trial of 3 epochs that may restart twice."""
    return _experiment(
        folder,
        searcher={"max_trials": 1, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
        max_restarts=2,
        **overrides,
    )


def _ranks_recorded(db: str, attempt: int, count: int = 2) -> bool:
    return len(trial_processes(db, ProcessRole.RANK, attempt=attempt)) >= count


def _start_single_trial(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> tuple[subprocess.Popen[str], str]:
    """A driver running :func:`_single_trial`, once its first checkpoint and ranks exist."""
    path = _single_trial(tmp_path / "exp")
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    driver = start_cli(["run", str(path), "--db", db, *executor_args(executor)], cli_env, tmp_path)
    wait_for(
        lambda: completed_checkpoints(db) >= 1 and _ranks_recorded(db, attempt=0),
        what="a first checkpoint",
    )
    return driver, db


def _only_trial(db: str) -> tuple[Trial, list[TrialRun]]:
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        session.expunge_all()
    return trial, runs


def _latest_checkpoint_before(db: str, trial_id: int, moment: dt.datetime) -> str:
    with session_scope(db) as session:
        uuid = session.scalar(
            select(Checkpoint.uuid)
            .where(Checkpoint.trial_id == trial_id, Checkpoint.created_at < moment)
            .order_by(Checkpoint.step.desc())
            .limit(1)
        )
    assert uuid is not None, "no checkpoint before the restart"
    return str(uuid)


def _assert_no_process_left(db: str) -> None:
    """Every recorded process of the search is gone, and recorded as gone."""
    with session_scope(db) as session:
        processes = list(session.scalars(select(TrialProcess)))
    assert processes, "no trial process was recorded"
    alive = [p.pid for p in processes if process_alive(p)]
    assert not alive, f"processes still running: {alive}"
    assert all(p.ended_at is not None for p in processes)


def _assert_restarted_from_latest_checkpoint(db: str) -> None:
    trial, runs = _only_trial(db)
    assert trial.state == TrialState.COMPLETED, trial.error
    assert [r.attempt for r in runs] == [0, 1], [(r.attempt, r.reason) for r in runs]
    assert runs[1].restored_from_step, "the restart began at step 0"
    expected = _latest_checkpoint_before(db, trial.id, runs[1].started_at)
    assert runs[1].restored_from_checkpoint == expected


def test_driver_killed_at_random_moments_and_resumed(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> None:
    path = _experiment(
        tmp_path / "exp",
        searcher={
            "max_trials": 8,
            "max_concurrent_trials": 2,
            "max_length": {"epochs": 3},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": 1},
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    common = ["--db", db, "--slots", "2", *executor_args(executor)]
    rng = random.Random(KILL_SEED)

    driver = start_cli(["run", str(path), *common], cli_env, tmp_path)
    wait_for(lambda: bool(trial_processes(db, ProcessRole.TORCHRUN)), what="a first trial")
    for kill in range(DRIVER_KILLS):
        time.sleep(rng.uniform(0.5, 8.0))
        assert driver.poll() is None, (
            f"the driver exited by itself before kill {kill + 1} (the search is too short "
            f"for {DRIVER_KILLS} kills?): {driver.communicate()[1][-3000:]}"
        )
        driver.kill()
        driver.communicate(timeout=30)
        driver = start_cli(["resume", "digits-large-batch", *common], cli_env, tmp_path)
    _, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-4000:]

    with session_scope(db) as session:
        assert len(list(session.scalars(select(Trial)))) == 8
        relaunched = list(session.scalars(select(TrialRun).where(TrialRun.attempt > 0)))
    assert relaunched, "no kill interrupted a trial"
    _assert_no_process_left(db)
    assert_search_consistent(db)


def test_killed_torchrun_takes_its_ranks_and_the_trial_restarts(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> None:
    driver, db = _start_single_trial(tmp_path, cli_env, executor)
    (torchrun,) = trial_processes(db, ProcessRole.TORCHRUN, attempt=0)
    ranks = trial_processes(db, ProcessRole.RANK, attempt=0)
    assert len(ranks) == 2 and all(process_alive(r) for r in ranks)

    os.kill(torchrun.pid, signal.SIGKILL)
    wait_for(
        lambda: not any(process_alive(r) for r in ranks),
        timeout=RANKS_GONE_WITHIN_S,
        what="the ranks of the killed torchrun to exit",
    )

    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-4000:]
    _assert_restarted_from_latest_checkpoint(db)
    _assert_no_process_left(db)
    assert_search_consistent(db)


def test_killed_rank_restarts_the_trial(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> None:
    driver, db = _start_single_trial(tmp_path, cli_env, executor)
    victim = next(r for r in trial_processes(db, ProcessRole.RANK, attempt=0) if r.rank == 1)
    assert process_alive(victim)
    os.kill(victim.pid, signal.SIGKILL)

    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-4000:]
    _, runs = _only_trial(db)
    assert runs[0].exit_code not in (0, None)
    _assert_restarted_from_latest_checkpoint(db)
    _assert_no_process_left(db)
    assert_search_consistent(db)


def test_hung_rank_is_ended_and_the_trial_restarts(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> None:
    # Rank 1 of attempt 0 hangs early in epoch 2 (23 batches an epoch), after the first
    # checkpoint; rank 0 then waits in the all-reduce and records nothing more.
    path = _single_trial(
        tmp_path / "exp",
        entrypoint="slow_model:HangingDigitsTrial",
        data={"batch_delay_s": 0.08, "hang_at_batch": 30, "hang_rank": 1},
        hang_timeout_s=8,
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    started = time.monotonic()
    result = run_cli(
        ["run", str(path), "--db", db, "--no-progress", *executor_args(executor)],
        cli_env,
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    _, runs = _only_trial(db)
    assert runs[0].reason and "hang" in runs[0].reason.lower(), runs[0].reason
    _assert_restarted_from_latest_checkpoint(db)
    _assert_no_process_left(db)
    assert_search_consistent(db)
    # Ended by the hang timeout, not by gloo's own (30 min) collective timeout.
    assert time.monotonic() - started < 300
