"""A search whose checkpoints live in an S3 bucket (moto's server, ``.ci/s3.sh``).

A one-slot trial on a warm worker, then ``slotsweep continue`` with one more: every
checkpoint is in the bucket (no local folder is made), retention deletes exactly the
checkpoints its policy names (objects and rows), the UI's download reads the bucket,
and the credentials appear in no output, log file, stored spec or database row. The
first trial's rank is SIGKILLed mid-epoch once its first checkpoint is recorded: the
driver's restart runs on a new warm job and restores that checkpoint from the bucket.
The uploads run in the background (``async_upload``): each trial's last checkpoint is
recorded before its end, and the driver's retention finds exactly what it should.
The store's own cases and a restore from the bucket after a killed rank are in
``tests/trials/runtime/test_checkpoint_bucket.py``.
"""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest
import yaml
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ProcessRole,
    TrialProcess,
    TrialRun,
    WarmJob,
    session_scope,
)
from tests.conftest import S3_SECRET, cli_environment
from tests.searcher.conftest import run_cli, start_cli, write_experiment
from trials import store_for
from ui._checkpoints import checkpoint_bytes, checkpoint_problem


@pytest.mark.slow
def test_a_search_keeps_its_checkpoints_in_a_bucket(s3_bucket: str, tmp_path: Path) -> None:
    env = cli_environment()  # after s3_bucket: the credentials are in the environment
    storage_path = f"{s3_bucket}/sweeps"
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="slow_model:SlowDigitsTrial",
        # 32 samples a batch: an epoch is many more than the 4 batches between checkpoints.
        hyperparameters={"global_batch_size": 32},
        # The first attempt slowly enough to be killed between its two checkpoints.
        data={"batch_delay_s": 1.0, "fast_from_attempt": 1},
        max_restarts=1,
        searcher={
            "max_trials": 1,
            "max_concurrent_trials": 1,
            "max_length": {"batches": 8},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": 1, "reuse_workers": True},
        checkpoint_storage={
            "path": storage_path,
            "save_trial_latest": 1,
            "save_trial_best": 0,
            "async_upload": True,
        },
    )
    config = yaml.safe_load(path.read_text())
    config["min_validation_period"] = config["min_checkpoint_period"] = {"batches": 4}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    db = f"sqlite:///{tmp_path / 'search.db'}"
    common = ["--db", db, "--slots", "2", "--no-progress"]
    killed: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=_kill_rank_once_checkpointed, args=(db, killed, done))
    killer.start()
    try:
        first, command_lines = _run_watching_command_lines(
            ["run", str(path), *common], env, tmp_path
        )
    finally:
        done.set()
        killer.join()
    assert first.returncode == 0, first.stderr[-3000:]
    assert killed, first.stdout[-3000:]
    assert any("trials.node.worker" in line for line in command_lines)
    assert not [line for line in command_lines if S3_SECRET in line]
    more = run_cli(["continue", "1", "--more-trials", "1", *common], env, tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]

    with session_scope(db) as session:
        rows = list(session.scalars(select(Checkpoint).order_by(Checkpoint.id)))
        session.expunge_all()
        warm_jobs = session.scalar(select(func.count()).select_from(WarmJob))
        # The experiment's own folder: no other database's experiment 1 writes there.
        key = session.get_one(Experiment, 1).checkpoint_key
    assert key is not None
    assert len({r.trial_id for r in rows}) == 2, (rows, first.stdout, more.stdout)
    assert warm_jobs  # the trials ran on warm workers
    # The restart: attempt 1 of the first trial, on a warm job of its own (the killed
    # attempt's job ended with it), restored the step-4 checkpoint, mid-epoch, from the
    # bucket.
    with session_scope(db) as session:
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.id)))
        restored = session.scalars(
            select(Checkpoint).where(Checkpoint.uuid == runs[1].restored_from_checkpoint)
        ).one()
        job_tokens = set(session.scalars(select(WarmJob.launch_token)))
    assert [(r.trial_id, r.attempt) for r in runs[:2]] == [
        (rows[0].trial_id, 0),
        (rows[0].trial_id, 1),
    ]
    assert runs[1].restored_from_step == 4 and restored.step == 4
    assert restored.epoch is not None and 0 < restored.epoch < 1
    assert restored.path.startswith(f"{storage_path}/1-{key}/{rows[0].trial_id}/")
    assert runs[0].launch_token != runs[1].launch_token
    assert {runs[0].launch_token, runs[1].launch_token} <= job_tokens
    assert not (tmp_path / "exp" / "checkpoints").exists()
    for trial_id in {r.trial_id for r in rows}:
        mine = [r for r in rows if r.trial_id == trial_id]
        # One checkpoint every 4 batches; only the newest survives (latest 1, best 0).
        assert [r.state for r in mine] == [CheckpointState.DELETED, CheckpointState.COMPLETED]
        folder = mine[0].path.rsplit("/", 1)[0]
        assert folder == f"{storage_path}/1-{key}/{trial_id}"
        store = store_for(folder)
        assert [store.is_complete(r.path) for r in mine] == [False, True]
        assert store.fs.ls(folder[len("s3://") :], refresh=True) == [mine[1].path[len("s3://") :]]
        assert checkpoint_problem(mine[1].path, "COMPLETED") is None
        names = zipfile.ZipFile(io.BytesIO(checkpoint_bytes(mine[1].path))).namelist()
        assert sorted(names) == ["metadata.json", "state.pt"]

    for text in (first.stdout, first.stderr, more.stdout, more.stderr):
        assert S3_SECRET not in text
    for file in tmp_path.rglob("*"):
        if file.is_file() and file.suffix != ".db":
            assert S3_SECRET.encode() not in file.read_bytes(), file
    with sqlite3.connect(tmp_path / "search.db") as connection:
        tables = [
            n for (n,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        dump = "\n".join(
            repr(row) for t in tables for row in connection.execute(f'SELECT * FROM "{t}"')
        )
    assert storage_path in dump and S3_SECRET not in dump


def _kill_rank_once_checkpointed(db: str, killed: list[int], done: threading.Event) -> None:
    """SIGKILL the first trial's rank once its first checkpoint is recorded, before its
    second (its pid in ``killed``); give up once ``done`` is set."""
    while not killed and not done.wait(0.1):
        _kill_rank(db, killed)


def _kill_rank(db: str, killed: list[int]) -> None:
    if not Path(db.removeprefix("sqlite:///")).exists():
        return
    try:
        with session_scope(db) as session:
            if session.scalar(select(func.count()).select_from(Checkpoint)) != 1:
                return
            pid = session.scalar(
                select(TrialProcess.pid).where(
                    TrialProcess.attempt == 0, TrialProcess.role == ProcessRole.RANK
                )
            )
    except OperationalError:  # the driver has not made its tables yet
        return
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def _run_watching_command_lines(
    args: list[str], env: dict[str, str], cwd: Path
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``slotsweep ARGS`` to its end, and every command line on the machine meanwhile."""
    driver = start_cli(args, env, cwd)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(driver.communicate(timeout=300)))
    reader.start()
    seen: set[str] = set()
    # The trials' processes are not the driver's children (they outlive it on purpose):
    # every process of the machine is looked at.
    while reader.is_alive():
        for process in psutil.process_iter(["cmdline"]):
            seen.add(" ".join(process.info["cmdline"] or []))
        time.sleep(0.5)
    reader.join()
    return subprocess.CompletedProcess(args, driver.returncode, *output), seen
