"""Attempt fencing and rank registration: an orphaned attempt records nothing."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import (
    Checkpoint,
    Metric,
    ProcessRole,
    Timing,
    Trial,
    TrialProcess,
    TrialRun,
    session_scope,
)
from trials.runtime._recorder import ChiefRecorder
from trials.runtime._recorder_queue import SUPERSEDED_EXIT_CODE, TrialStopped
from trials.runtime._timing import TimingWindow

from .conftest import TrialHandle, add_run, run_torchrun


def _count(db_url: str, model: type, trial_id: int) -> int:
    with session_scope(db_url) as session:
        return int(
            session.scalar(
                select(func.count()).select_from(model).where(model.trial_id == trial_id)
            )
            or 0
        )


def _window(step: int) -> TimingWindow:
    return TimingWindow("train_batch", step - 1, step, 1, 0.1, 0.1, 0.1, 0.1)


def test_a_superseded_recorder_is_refused_and_writes_nothing(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> None:
    handle = make_trial()
    trial_id, db_url = handle.spec.trial_id, handle.db_url
    recorder = ChiefRecorder(handle.spec)
    try:
        recorder.training_metrics(step=1, epoch=None, values={"loss": 1.0})
        recorder.timings([_window(1)])
        recorder.flush()
        with session_scope(db_url) as session:
            run = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial_id)).one()
            assert run.progress_at is not None
        assert (_count(db_url, Metric, trial_id), _count(db_url, Timing, trial_id)) == (1, 1)

        # The driver restarts the trial while this attempt's process lives on.
        add_run(db_url, trial_id, attempt=1)
        recorder.training_metrics(step=2, epoch=None, values={"loss": 0.5})
        recorder.timings([_window(2)])
        message = (
            f"attempt 0 of trial {trial_id} was superseded by attempt 1; "
            "stopping without recording"
        )
        with pytest.raises(TrialStopped, match=message) as stopped:
            recorder.flush()
        assert stopped.value.exit_code == SUPERSEDED_EXIT_CODE
        # From now on every use stops the rank, and nothing reaches the database.
        with pytest.raises(TrialStopped):
            recorder.validation_metrics(step=2, epoch=None, values={"val_loss": 0.1})
        folder = tmp_path / "ckpt"
        folder.mkdir()
        with pytest.raises(TrialStopped):
            recorder.checkpoint(
                uuid="orphan", step=2, epoch=None, path=folder, size_bytes=1, metrics={}
            )
        with pytest.raises(TrialStopped):
            recorder.finished(2)
    finally:
        recorder.close()
    assert (_count(db_url, Metric, trial_id), _count(db_url, Timing, trial_id)) == (1, 1)
    assert _count(db_url, Checkpoint, trial_id) == 0
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        assert (trial.total_batches, trial.finished_at) == (1, None)


def test_a_superseded_recorder_does_not_delete_the_checkpoint_the_new_attempt_restores(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> None:
    # save_trial_latest 0, best 0: left alone, retention would delete all but the newest.
    handle = make_trial(
        checkpoint_storage={
            "path": str(tmp_path / "ckpts"),
            "save_trial_latest": 0,
            "save_trial_best": 0,
        }
    )
    trial_id = handle.spec.trial_id
    recorder = ChiefRecorder(handle.spec)
    try:
        first = tmp_path / "c1"
        first.mkdir()
        recorder.checkpoint(uuid="c1", step=4, epoch=None, path=first, size_bytes=1, metrics={})
        handle.with_changes(attempt=1, restore_checkpoint_path=str(first))
        second = tmp_path / "c2"
        second.mkdir()
        with pytest.raises(TrialStopped):
            recorder.checkpoint(
                uuid="c2", step=8, epoch=None, path=second, size_bytes=1, metrics={}
            )
    finally:
        recorder.close()
    assert first.is_dir()
    with session_scope(handle.db_url) as session:
        assert list(session.scalars(select(Checkpoint.uuid))) == ["c1"]
        run = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trial_id, TrialRun.attempt == 1)
        ).one()
        assert run.restored_from_checkpoint == "c1"


@pytest.mark.slow
def test_every_rank_of_a_two_rank_run_is_registered(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial()
    result = run_torchrun(
        ["-m", "trials.node.worker"],
        env={
            "SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text(),
            "SLOTSWEEP_AGENT": "agent-x",
            "SLOTSWEEP_SLOTS": "3,5",
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    with session_scope(handle.db_url) as session:
        run = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == handle.spec.trial_id)
        ).one()
        rows = list(
            session.scalars(
                select(TrialProcess)
                .where(TrialProcess.run_id == run.id)
                .order_by(TrialProcess.rank)
            )
        )
        assert run.progress_at is not None and run.progress_at >= run.started_at
    assert [(r.role, r.rank, r.local_rank, r.slots) for r in rows] == [
        (ProcessRole.RANK, 0, 0, [3]),
        (ProcessRole.RANK, 1, 1, [5]),
    ]
    assert all(r.agent == "agent-x" and r.host == socket.gethostname() for r in rows)
    assert all(r.trial_id == handle.spec.trial_id and r.attempt == 0 for r in rows)
    assert len({r.pid for r in rows}) == 2 and os.getpid() not in {r.pid for r in rows}
    # Start times in seconds since the epoch, from the last few minutes.
    assert all(time.time() - 600 < r.create_time <= time.time() for r in rows)


@pytest.mark.slow
def test_a_superseded_run_stops_with_one_line_and_records_nothing_more(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        max_length={"batches": 400},
        min_validation_period={"batches": 400},
        hparams={"global_batch_size": 8, "sleep_s": 0.05},
    )
    trial_id, db_url = handle.spec.trial_id, handle.db_url

    def supersede_once_training() -> None:
        deadline = time.monotonic() + 120
        while _count(db_url, Metric, trial_id) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        add_run(db_url, trial_id, attempt=1)

    superseder = threading.Thread(target=supersede_once_training, daemon=True)
    superseder.start()
    started = time.monotonic()
    result = run_torchrun(
        ["-m", "trials.node.worker"], env={"SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text()}
    )
    superseder.join()
    output = result.stdout + result.stderr
    sys.stdout.write(output[-2000:])
    assert result.returncode != 0
    line = (
        f"[rank 0] slotsweep: attempt 0 of trial {trial_id} was superseded by attempt 1; "
        "stopping without recording"
    )
    assert output.count(line) == 1
    assert "Traceback" not in output.split(line)[0]
    assert time.monotonic() - started < 60  # 400 batches of 50 ms would take 20 s more
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None and trial.finished_at is None
        ended = session.scalars(
            select(TrialRun.ended_at).where(TrialRun.trial_id == trial_id, TrialRun.attempt == 0)
        ).one()
        assert ended is not None
        late = session.scalar(
            select(func.count()).where(Metric.trial_id == trial_id, Metric.recorded_at > ended)
        )
    assert late == 0
