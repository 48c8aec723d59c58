"""Pause, resume, enqueue and kill, with real drivers and real torchrun jobs.

Crashes at chosen moments (a machine losing power: the driver and every trial process
get SIGKILL) are in :mod:`tests.searcher.driver.test_fault_injection`
(``test_search_survives_crashes_at_chosen_and_random_moments``), in the same search as
the driver's random kills.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import (
    Checkpoint,
    Experiment,
    ExperimentState,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import (
    open_runs,
    run_cli,
    start_cli,
    wait_for,
    write_experiment,
)

pytestmark = pytest.mark.slow

SLOW = {"entrypoint": "slow_model:SlowDigitsTrial"}


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
    rows = json.loads(tasks.stdout)["slots"]
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
