"""Crashes, restarts, pause and resume, with real drivers and real torchrun jobs.

"Crash" here is a machine losing power: the driver and every trial process get
SIGKILL at a chosen moment. Nothing finished may be lost, nothing finished may run
again, and interrupted trials continue from their latest checkpoint.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

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
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    last_run_id,
    open_runs,
    power_loss,
    run_cli,
    start_cli,
    torchrun_pids,
    wait_for,
    write_experiment,
)

pytestmark = pytest.mark.slow

SLOW = {"entrypoint": "slow_model:SlowDigitsTrial"}


def _checkpoint_being_written(root: Path) -> bool:
    return any(root.glob("**/.tmp-*"))


def _finished_trials(db: str) -> dict[int, object]:
    with session_scope(db) as session:
        return {
            t.id: t.ended_at
            for t in session.scalars(select(Trial))
            if t.state in (TrialState.COMPLETED, TrialState.PRUNED, TrialState.ERROR)
        }


def test_search_survives_crashes_at_several_moments(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        **SLOW,
        searcher={"max_trials": 3, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
        data={"batch_delay_s": 0.08, "fsync_delay_s": 0.4},
    )
    checkpoint_root = tmp_path / "exp" / "checkpoints"
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    run_args = ["run", str(path), "--db", db]
    resume_args = ["resume", "digits-large-batch", "--db", db]

    # 1. Power loss after the first trial recorded a checkpoint.
    driver = start_cli(run_args, cli_env, tmp_path)
    wait_for(lambda: completed_checkpoints(db) >= 1, what="a first checkpoint")
    power_loss(driver, db)
    finished_before = _finished_trials(db)

    # 2. Power loss in the middle of writing a checkpoint.
    last = last_run_id(db)
    driver = start_cli(resume_args, cli_env, tmp_path)
    wait_for(
        lambda: bool(open_runs(db, last)) and _checkpoint_being_written(checkpoint_root),
        what="a checkpoint being written",
    )
    power_loss(driver, db, last)

    # 3. Only the driver dies; its trial keeps running until the resume ends it.
    last = last_run_id(db)
    driver = start_cli(resume_args, cli_env, tmp_path)
    wait_for(lambda: bool(open_runs(db, last)), what="a running trial")
    leftover = torchrun_pids(db, last)
    finished_mid = _finished_trials(db)
    driver.kill()
    driver.communicate(timeout=30)
    assert all(psutil.pid_exists(pid) for pid in leftover)

    final = run_cli([*resume_args, "--no-progress"], cli_env, tmp_path, timeout=600)
    assert final.returncode == 0, final.stderr[-4000:]
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in leftover
    )

    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert len(trials) == 3
        assert all(t.state == TrialState.COMPLETED for t in trials), [t.error for t in trials]
        assert session.scalar(select(func.count()).select_from(Metric))
        runs = list(
            session.scalars(select(TrialRun).order_by(TrialRun.trial_id, TrialRun.attempt))
        )
        interrupted = [r for r in runs if r.attempt > 0]
        assert interrupted, "no trial was interrupted"
        # The trial interrupted after its first checkpoint went on from it, not from step 0.
        first_trial_runs = [r for r in runs if r.trial_id == trials[0].id]
        assert len(first_trial_runs) >= 2
        assert (
            first_trial_runs[1].restored_from_step and first_trial_runs[1].restored_from_step > 0
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
    with session_scope(db) as session:
        for checkpoint in session.scalars(
            select(Checkpoint).where(Checkpoint.state == CheckpointState.COMPLETED)
        ):
            assert Path(checkpoint.path).exists()
    study = optuna.load_study(study_name=study_name, storage=db)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    # No metric recorded twice, no attempts overlapping, Optuna agreeing, and the rest.
    assert_search_consistent(db)


def test_ctrl_c_pauses_then_activate_and_enqueue_finish_the_search(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        **SLOW,
        searcher={"max_trials": 1, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
        data={"batch_delay_s": 0.08},
        min_checkpoint_period={"epochs": 3},
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    driver = start_cli(["run", str(path), "--db", db], cli_env, tmp_path)

    def trained_some() -> bool:
        with session_scope(db) as session:
            return bool(session.scalar(select(func.max(Trial.total_batches))))

    wait_for(trained_some, what="training to start")
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-4000:]
    with session_scope(db) as session:
        assert session.scalars(select(Experiment)).one().state == ExperimentState.PAUSED
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.QUEUED and trial.restarts == 0
        paused_at = session.scalar(select(func.max(Checkpoint.step)))
        assert paused_at, "the paused trial wrote no checkpoint"

    enqueued = run_cli(
        [
            "enqueue",
            "digits-large-batch",
            "lr=0.05",
            "optimizer=sgd",
            "global_batch_size=64",
            "warmup_epochs=0",
            "--db",
            db,
        ],
        cli_env,
        tmp_path,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    bad = run_cli(
        ["enqueue", "digits-large-batch", "optimizer=rmsprop", "--db", db], cli_env, tmp_path
    )
    assert bad.returncode == 2 and "optimizer" in bad.stderr

    activated = run_cli(
        ["activate", "digits-large-batch", "--db", db, "--no-progress"], cli_env, tmp_path
    )
    assert activated.returncode == 0, activated.stderr[-4000:]
    with session_scope(db) as session:
        assert session.scalars(select(Experiment)).one().state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert [t.state for t in trials] == [TrialState.COMPLETED, TrialState.COMPLETED]
        assert trials[1].hparams["lr"] == 0.05 and trials[1].hparams["optimizer"] == "sgd"
        resumed = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trials[0].id, TrialRun.attempt == 1)
        ).one()
        assert resumed.restored_from_step == paused_at


def test_pause_and_kill_from_another_terminal(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write_experiment(
        tmp_path / "exp",
        **SLOW,
        searcher={"max_trials": 2, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
        data={"batch_delay_s": 0.08},
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    driver = start_cli(["run", str(path), "--db", db, "--slots", "3"], cli_env, tmp_path)
    wait_for(lambda: bool(open_runs(db)), what="a running trial")
    tasks = run_cli(["task", "list", "--json", "--db", db, "--slots", "3"], cli_env, tmp_path)
    assert tasks.returncode == 0, tasks.stderr
    rows = json.loads(tasks.stdout)
    assert len(rows) == 3 and len([r for r in rows if r["trial"] == "1.0"]) == 2, rows
    paused = run_cli(["pause", "digits-large-batch", "--db", db], cli_env, tmp_path)
    assert paused.returncode == 0, paused.stderr
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    with session_scope(db) as session:
        assert session.scalars(select(Experiment)).one().state == ExperimentState.PAUSED

    driver = start_cli(["activate", "digits-large-batch", "--db", db], cli_env, tmp_path)
    wait_for(lambda: bool(open_runs(db)), what="the trial to run again")
    killed = run_cli(["kill", "digits-large-batch", "--db", db], cli_env, tmp_path)
    assert killed.returncode == 0, killed.stderr
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-3000:]
    with session_scope(db) as session:
        assert session.scalars(select(Experiment)).one().state == ExperimentState.CANCELED
        states = {t.state for t in session.scalars(select(Trial))}
        assert TrialState.RUNNING not in states and TrialState.QUEUED not in states
    again = run_cli(["resume", "digits-large-batch", "--db", db], cli_env, tmp_path)
    assert again.returncode == 2 and "CANCELED" in again.stderr
