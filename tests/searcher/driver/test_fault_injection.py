"""Fault injection: kill or hang the parts of a running search, then judge the whole database.

Each test runs real searches through the CLI, injects one kind of fault (power loss at
chosen moments then the driver SIGKILLed at random ones, a trial's ``torchrun``
SIGKILLed, one rank SIGKILLed, one rank hung), lets the search finish, and ends with the
same verdict (:func:`tests.searcher.conftest.assert_search_consistent`): the
consistency check finds nothing (every finished trial kept, no metric recorded twice, no
restart from step 0 past a checkpoint, no two attempts of a trial overlapping, no slot
held by two trials), every trial is terminal and the experiment COMPLETED.

Every test takes the ``executor`` fixture over ``FAULT_EXECUTORS``, so each executor
added later must pass them all. The processes to kill are found as a later driver would find them: from their
``slotsweep_trial_processes`` rows (pid and kernel start time).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from sqlalchemy import func, select

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    ProcessRole,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    optuna_storage,
    session_scope,
)
from tests.ray_cluster import RayCluster
from tests.searcher.conftest import (
    FAULT_EXECUTORS,
    assert_search_consistent,
    completed_checkpoints,
    executor_args,
    executor_resources,
    last_run_id,
    open_runs,
    power_loss,
    process_alive,
    start_cli,
    torchrun_pids,
    trial_processes,
    wait_for,
    write_experiment,
)

pytestmark = pytest.mark.slow

# Driver kills happen at moments drawn from this seed, so a failure can be replayed.
KILL_SEED = 13
# How many: the chosen moment 3 (the driver alone SIGKILLed while its trials run, then
# resumed) already takes every executor through a killed driver's resume; the random
# moments add draws of where in its loop the driver dies, the same code whatever the
# executor, so the local executor takes two, warm jobs (the driver's hand-over) one,
# and Ray none (each costs a driver's start, a new start of the trials it had
# launched by then and, on Ray, a client connection and new node runners).
DRIVER_KILLS = {"local": 2, "local-warm": 1, "ray": 0}
# Whether the chosen moment 2 (power loss while a checkpoint is written) is taken: what
# it tests is the ranks' checkpoint write and its registration, the same code whatever
# the executor, so Ray (where each power loss costs a client connection and new node
# runners) leaves it to the local executors.
MID_CHECKPOINT_POWER_LOSS = {"local": True, "local-warm": True, "ray": False}
# Trials of the search that the driver is crashed in: two rounds of two where the driver
# is also killed at random moments (the first round outlasts the kills, the second
# finishes after them); on Ray, which takes no random kill, the first round alone (a
# second round would only start two more trials on new node runners, which its other
# tests do, at about 20 s of the Ray group's time).
SEARCH_TRIALS = {"local": 4, "local-warm": 4, "ray": 2}
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


def _ranks_recorded(db: str, attempt: int, count: int = 2) -> bool:
    return len(trial_processes(db, ProcessRole.RANK, attempt=attempt)) >= count


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


def _tmp_checkpoint_dirs(root: Path) -> set[Path]:
    """The ``.tmp-*`` directories of checkpoints being written (or left by a crash)."""
    return set(root.glob("**/.tmp-*"))


def _finished_trials(db: str) -> dict[int, object]:
    with session_scope(db) as session:
        return {
            t.id: t.ended_at
            for t in session.scalars(select(Trial))
            if t.state in (TrialState.COMPLETED, TrialState.PRUNED, TrialState.ERROR)
        }


def _launched(db: str, after_id: int, count: int) -> bool:
    """Whether ``count`` runs newer than ``after_id`` are open, each with its torchrun pids
    recorded (a run's row is written before its processes start)."""
    runs = open_runs(db, after_id)
    return len(runs) >= count and all("pid" in node for run in runs for node in run.agents)


def _first_checkpointed_trial(db: str) -> int:
    with session_scope(db) as session:
        trial_id = session.scalar(
            select(Checkpoint.trial_id)
            .where(Checkpoint.state == CheckpointState.COMPLETED)
            .order_by(Checkpoint.id)
            .limit(1)
        )
    assert trial_id is not None
    return int(trial_id)


@pytest.mark.parametrize("executor", FAULT_EXECUTORS, indirect=True)
def test_search_survives_crashes_at_chosen_and_random_moments(
    tmp_path: Path,
    cli_env: dict[str, str],
    executor: str,
    executor_database: str,
    request: pytest.FixtureRequest,
) -> None:
    """One search crashed at three chosen moments, then its driver killed at random ones.

    Chosen moments ("power loss": the driver and every trial process SIGKILLed at once):
    (1) after a trial recorded its first checkpoint, (2) in the middle of writing a
    checkpoint (``MID_CHECKPOINT_POWER_LOSS``), (3) only the driver dies, its trials
    keep running until a resume ends them. Then the driver is SIGKILLed at ``DRIVER_KILLS`` seeded random moments and
    resumed each time. Nothing finished may be lost or run again, the trial interrupted
    after its first checkpoint goes on from it, no half-written checkpoint is
    registered, Optuna agrees, and the whole database is consistent. The runs the
    driver left at (1) were ended by the resume, which says why; on Ray the node
    runners (actors) of the driver killed at (3) outlived it, and no actor of the
    search is left at the end.
    """
    ray_cluster: RayCluster | None = (
        request.getfixturevalue("ray_cluster") if executor == "ray" else None
    )
    path = _experiment(
        tmp_path / "exp",
        searcher={
            # The kills land while the first two trials run (each resume restarts them,
            # so they outlast the kills); the others, if any, finish after them.
            "max_trials": SEARCH_TRIALS[executor],
            "max_concurrent_trials": 2,
            "max_length": {"epochs": 3},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": 1, **executor_resources(executor)},
        # Slow fsyncs hold each checkpoint mid-write long enough to crash there.
        data={"batch_delay_s": 0.08, "fsync_delay_s": 0.4},
    )
    checkpoint_root = tmp_path / "exp" / "checkpoints"
    db = executor_database
    # Two slots of this machine; a cluster file (Ray's) gives each agent's slots itself.
    slots = [] if executor == "ray" else ["--slots", "2"]
    common = ["--db", db, *slots, *executor_args(executor)]
    resume_args = ["resume", "digits-large-batch", *common]

    # 1. Power loss after a trial recorded its first checkpoint.
    driver = start_cli(["run", str(path), *common], cli_env, tmp_path)
    wait_for(
        lambda: completed_checkpoints(db) >= 1 and _launched(db, 0, 2), what="a first checkpoint"
    )
    first_runs = {run.id for run in open_runs(db)}
    power_loss(driver, db)
    checkpointed_trial = _first_checkpointed_trial(db)
    finished_before = _finished_trials(db)

    # 2. Power loss in the middle of writing a checkpoint (a new one: the first power
    # loss may have left a half-written one behind).
    if MID_CHECKPOINT_POWER_LOSS[executor]:
        last = last_run_id(db)
        left_behind = _tmp_checkpoint_dirs(checkpoint_root)
        driver = start_cli(resume_args, cli_env, tmp_path)
        wait_for(
            lambda: (
                _launched(db, last, 2)
                and bool(_tmp_checkpoint_dirs(checkpoint_root) - left_behind)
            ),
            what="a checkpoint being written",
        )
        power_loss(driver, db, last)

    # 3. Only the driver dies; its trials keep running until a resume ends them. On
    # Ray, a client connected beforehand looks at the actors right after the kill,
    # within Ray's own clean-up of a dead driver's actors (30 s).
    with contextlib.ExitStack() as stack:
        lister = (
            stack.enter_context(ray_cluster.actor_lister()) if ray_cluster is not None else None
        )
        last = last_run_id(db)
        driver = start_cli(resume_args, cli_env, tmp_path)
        wait_for(lambda: _launched(db, last, 2), what="two running trials")
        leftover = torchrun_pids(db, last)
        finished_mid = _finished_trials(db)
        driver.kill()
        driver.communicate(timeout=30)
        assert leftover and all(psutil.pid_exists(pid) for pid in leftover)
        if lister is not None:
            assert lister(), "the killed driver's node runners (Ray actors) are gone"

    # 4. The driver SIGKILLed at random moments, resumed each time.
    rng = random.Random(KILL_SEED)
    driver = start_cli(resume_args, cli_env, tmp_path)
    kills = DRIVER_KILLS[executor]
    for kill in range(kills):
        time.sleep(rng.uniform(0.5, 4.0))
        assert driver.poll() is None, (
            f"the driver exited by itself before kill {kill + 1} (the search is too short "
            f"for {kills} kills?): {driver.communicate()[1][-3000:]}"
        )
        driver.kill()
        driver.communicate(timeout=30)
        driver = start_cli(resume_args, cli_env, tmp_path)
    _, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-4000:]
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in leftover
    )

    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert len(trials) == SEARCH_TRIALS[executor]
        assert all(t.state == TrialState.COMPLETED for t in trials), [t.error for t in trials]
        assert session.scalar(select(func.count()).select_from(Metric))
        runs = list(
            session.scalars(select(TrialRun).order_by(TrialRun.trial_id, TrialRun.attempt))
        )
        assert [r for r in runs if r.attempt > 0], "no kill interrupted a trial"
        # The next resume ended the first runs the dead driver left, saying why (went on
        # from a checkpoint, or the trial had ended meanwhile); a later attempt's reason
        # stays the one it started with ("continued").
        ended_by_resume = [r.reason or "" for r in runs if r.id in first_runs]
        assert len(ended_by_resume) == 2, ended_by_resume
        assert all("driver stopped" in reason for reason in ended_by_resume), ended_by_resume
        # The trial interrupted after its first checkpoint went on from it, not from step 0.
        checkpointed_runs = [r for r in runs if r.trial_id == checkpointed_trial]
        assert len(checkpointed_runs) >= 2
        assert (
            checkpointed_runs[1].restored_from_step and checkpointed_runs[1].restored_from_step > 0
        )
        # Finished trials stayed finished: never run again, end time untouched.
        for trial in trials:
            for earlier in (finished_before, finished_mid):
                if trial.id in earlier:
                    assert trial.ended_at == earlier[trial.id]
                    assert all(
                        r.started_at <= earlier[trial.id]  # type: ignore[operator]
                        for r in runs
                        if r.trial_id == trial.id
                    )
        study_name = experiment.study_name
        # No half-written checkpoint is registered, and every registered one exists.
        for checkpoint in session.scalars(
            select(Checkpoint).where(Checkpoint.state == CheckpointState.COMPLETED)
        ):
            assert Path(checkpoint.path).exists()
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * SEARCH_TRIALS[executor]
    _assert_no_process_left(db)
    if ray_cluster is not None:
        assert not ray_cluster.leftover_actors()
    # No metric recorded twice, no attempts overlapping, Optuna agreeing, and the rest.
    assert_search_consistent(db)


def _completed_checkpoint_past(db: str, step: int) -> bool:
    """Whether a checkpoint of a step past ``step`` was completed (retention may have
    deleted it since: its row stays)."""
    with session_scope(db) as session:
        newest = session.scalar(select(func.max(Checkpoint.step)))
    return newest is not None and newest > step


@pytest.mark.parametrize("executor", FAULT_EXECUTORS, indirect=True)
def test_killed_torchrun_killed_rank_and_hung_rank_each_restart_the_trial(
    tmp_path: Path, cli_env: dict[str, str], executor: str, executor_database: str
) -> None:
    """One 2-slot trial meets three faults, one per attempt, each after a checkpoint:

    - attempt 0: its ``torchrun`` is SIGKILLed; the ranks die with it;
    - attempt 1: rank 1 is SIGKILLed; the attempt exits non-zero;
    - attempt 2: rank 1 hangs (rank 0 then waits in the all-reduce and records nothing
      more); the driver's ``hang_timeout_s`` ends the attempt, not gloo's own (30 min)
      collective timeout;

    and after each the trial restarts from its latest checkpoint; attempt 3 completes it.
    """
    # 23 batches an epoch; attempt 2 hangs at its 10th batch, after restoring a checkpoint.
    path = _experiment(
        tmp_path / "exp",
        entrypoint="slow_model:HangingDigitsTrial",
        searcher={"max_trials": 1, "max_length": {"epochs": 4}, "pruner": {"name": "none"}},
        data={"batch_delay_s": 0.08, "hang_attempt": 2, "hang_at_batch": 10, "hang_rank": 1},
        # Long enough that a loaded machine's slow batches are no hang.
        hang_timeout_s=15,
        max_restarts=3,
        resources=executor_resources(executor),
    )
    db = executor_database
    driver = start_cli(["run", str(path), "--db", db, *executor_args(executor)], cli_env, tmp_path)

    # Attempt 0: torchrun SIGKILLed after the first checkpoint; its ranks go with it.
    wait_for(
        lambda: completed_checkpoints(db) >= 1 and _ranks_recorded(db, attempt=0),
        what="a first checkpoint",
    )
    (torchrun,) = trial_processes(db, ProcessRole.TORCHRUN, attempt=0)
    ranks = trial_processes(db, ProcessRole.RANK, attempt=0)
    assert len(ranks) == 2 and all(process_alive(r) for r in ranks)
    os.kill(torchrun.pid, signal.SIGKILL)
    wait_for(
        lambda: not any(process_alive(r) for r in ranks),
        timeout=RANKS_GONE_WITHIN_S,
        what="the ranks of the killed torchrun to exit",
    )

    # Attempt 1: rank 1 SIGKILLed once the attempt has checkpointed past its restore point.
    wait_for(lambda: _ranks_recorded(db, attempt=1), what="the ranks of attempt 1")
    _, runs = _only_trial(db)
    restored = runs[1].restored_from_step or 0
    wait_for(lambda: _completed_checkpoint_past(db, restored), what="a checkpoint of attempt 1")
    victim = next(r for r in trial_processes(db, ProcessRole.RANK, attempt=1) if r.rank == 1)
    assert process_alive(victim)
    os.kill(victim.pid, signal.SIGKILL)

    # Attempt 2 hangs; attempt 3 completes the trial.
    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-4000:]

    trial, runs = _only_trial(db)
    assert trial.state == TrialState.COMPLETED, trial.error
    assert [r.attempt for r in runs] == [0, 1, 2, 3], [(r.attempt, r.reason) for r in runs]
    assert runs[1].exit_code not in (0, None)  # the killed rank
    assert runs[2].reason and "hang" in runs[2].reason.lower(), runs[2].reason
    # Ended by the hang timeout, not by gloo's own (30 min) collective timeout.
    assert runs[2].ended_at is not None
    assert (runs[2].ended_at - runs[2].started_at).total_seconds() < 300
    for restart in runs[1:]:
        assert restart.restored_from_step, f"attempt {restart.attempt} began at step 0"
        expected = _latest_checkpoint_before(db, trial.id, restart.started_at)
        assert restart.restored_from_checkpoint == expected, restart.attempt
    _assert_no_process_left(db)
    assert_search_consistent(db)
