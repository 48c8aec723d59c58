"""``checkpoint_storage.async_upload``: rank 0's checkpoint writes beside training.

In a folder and in an S3 bucket (moto's server): a write returns before its files are
written; the snapshot is the state as it was at the save, whatever training does to
the tensors after; a checkpoint is recorded only once it is whole, in the order the
saves were made, and the next save waits for the one before; a write the storage
refuses fails at the next wait with the same one line as a synchronous save.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from trials import store_for
from trials.checkpoint_storage import CheckpointStorageError
from trials.runtime._checkpoint import TrialCheckpoints, read_checkpoint
from trials.runtime._recording import NoRecorder


class _GatedRecorder(NoRecorder):
    """Records a checkpoint only once ``gate`` opens, checking that it is whole by then."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.recorded: list[tuple[int, float]] = []

    def checkpoint(self, *, step: int, path: Path | str, **fields: object) -> list[str]:
        assert store_for(str(path)).is_complete(str(path)), path
        assert self.gate.wait(timeout=60)
        self.recorded.append((step, float(read_checkpoint(path)["w"][0])))
        return []


@pytest.fixture(
    params=["folder", pytest.param("bucket", marks=pytest.mark.slow)],
)
def storage_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the checkpoints go: a local folder, or a fresh S3 bucket."""
    if request.param == "bucket":
        return f"{request.getfixturevalue('s3_bucket')}/ckpt"
    return str(tmp_path / "ckpt")


def test_a_background_write_overlaps_and_is_recorded_once_whole(storage_root: str) -> None:
    recorder = _GatedRecorder()
    writer = TrialCheckpoints(
        f"{storage_root}/1/1",
        experiment_id=1,
        trial_id=1,
        recorder=recorder,
        async_upload=True,
    )
    weights = torch.zeros(1000)
    writer.write(lambda: {"w": weights}, steps_completed=4, epoch=0.5, metrics={})
    assert recorder.recorded == []  # the save returned; the write goes on
    weights += 1.0  # training goes on changing the tensors

    second = threading.Thread(
        target=writer.write,
        args=(lambda: {"w": weights},),
        kwargs={"steps_completed": 8, "epoch": 1.0, "metrics": {}},
    )
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()  # the next save waits for the previous write
    recorder.gate.set()
    second.join(timeout=60)
    writer.wait()
    assert recorder.recorded == [(4, 0.0), (8, 1.0)]


def test_a_refused_background_write_fails_at_the_next_wait(
    storage_root: str, tmp_path: Path
) -> None:
    if storage_root.startswith("s3://"):
        folder = f"{storage_root.split('/ckpt')[0]}-missing/ckpt/1/1"
        reason = "The specified bucket does not exist"
    else:
        (tmp_path / "a-file").write_text("")
        folder = str(tmp_path / "a-file" / "1" / "1")
        reason = "Not a directory"
    recorder = _GatedRecorder()
    recorder.gate.set()
    writer = TrialCheckpoints(
        folder, experiment_id=1, trial_id=1, recorder=recorder, async_upload=True
    )
    writer.write(lambda: {"w": torch.zeros(10)}, steps_completed=4, epoch=None, metrics={})
    with pytest.raises(CheckpointStorageError) as error:
        writer.wait()
    assert str(error.value) == f"checkpoint_storage.path {folder}: {reason}"
    writer.wait()  # raised once
    assert recorder.recorded == []
