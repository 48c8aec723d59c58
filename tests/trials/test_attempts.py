"""A run's processes in the database: confirmed gone before slots or the next attempt."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import select

from storage import ProcessRole, TrialProcess, TrialRun, session_scope, upgrade_schema
from tests.conftest import add_experiment
from trials.coordination.attempts import end_run, open_runs, trial_processes_gone
from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR, ProcessRef

pytestmark = pytest.mark.slow  # starts real processes


def _run_with_process(
    db_url: str, process: subprocess.Popen[bytes] | None, token: str
) -> tuple[int, int]:
    """A trial with one open run whose recorded torchrun is ``process``; (trial, run)."""
    upgrade_schema(db_url)
    _, (trial_id,) = add_experiment(db_url)
    with session_scope(db_url) as session:
        run = TrialRun(trial_id=trial_id, attempt=0, agents=[], launch_token=token)
        session.add(run)
        session.flush()
        if process is not None:
            ref = ProcessRef.of(process.pid)
            session.add(
                TrialProcess(
                    run_id=run.id,
                    trial_id=trial_id,
                    attempt=0,
                    role=ProcessRole.TORCHRUN,
                    agent="local",
                    host=ref.host,
                    slots=[0],
                    pid=ref.pid,
                    create_time=ref.create_time,
                )
            )
        return trial_id, run.id


def _sleeper(token: str | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if token:
        env[LAUNCH_TOKEN_ENV_VAR] = token
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True
    )


def test_a_live_recorded_process_keeps_the_trial_busy_until_it_is_gone(db_url: str) -> None:
    process = _sleeper()
    try:
        trial_id, run_id = _run_with_process(db_url, process, uuid.uuid4().hex)
        with session_scope(db_url) as session:
            assert not trial_processes_gone(session, trial_id)
        process.kill()
        process.wait()
        with session_scope(db_url) as session:
            assert trial_processes_gone(session, trial_id)
        with session_scope(db_url) as session:
            row = session.scalars(select(TrialProcess).where(TrialProcess.run_id == run_id)).one()
            assert row.ended_at is not None
    finally:
        process.kill()


def test_an_unrecorded_process_with_the_runs_token_keeps_the_trial_busy(db_url: str) -> None:
    token = uuid.uuid4().hex
    process = _sleeper(token)
    try:
        trial_id, _ = _run_with_process(db_url, None, token)
        with session_scope(db_url) as session:
            assert not trial_processes_gone(session, trial_id)
    finally:
        process.kill()
        process.wait()


def test_ending_a_run_ends_its_processes_and_then_the_run(db_url: str) -> None:
    token = uuid.uuid4().hex
    recorded, unrecorded = _sleeper(token), _sleeper(token)
    try:
        trial_id, run_id = _run_with_process(db_url, recorded, token)
        with session_scope(db_url) as session:
            (run,) = open_runs(session, trial_id)
            assert end_run(session, run, reason="driver stopped", grace_s=5.0)
        assert recorded.wait(timeout=5) is not None
        assert unrecorded.wait(timeout=5) is not None
        with session_scope(db_url) as session:
            assert open_runs(session, trial_id) == []
            run = session.get(TrialRun, run_id)
            assert run is not None and run.ended_at is not None
            assert run.reason == "driver stopped"
            assert trial_processes_gone(session, trial_id)
    finally:
        recorded.kill()
        unrecorded.kill()


def test_a_process_on_another_host_keeps_the_run_open(db_url: str) -> None:
    trial_id, run_id = _run_with_process(db_url, None, uuid.uuid4().hex)
    with session_scope(db_url) as session:
        session.add(
            TrialProcess(
                run_id=run_id,
                trial_id=trial_id,
                attempt=0,
                role=ProcessRole.RANK,
                agent="far",
                host="gpu-node-17.example",
                slots=[0],
                pid=1234,
                create_time=1.0,
            )
        )
    with session_scope(db_url) as session:
        (run,) = open_runs(session, trial_id)
        assert not end_run(session, run)
        assert not trial_processes_gone(session, trial_id)
        assert open_runs(session, trial_id) == [run]
