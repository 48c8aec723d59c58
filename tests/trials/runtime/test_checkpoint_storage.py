"""A checkpoint folder that is full or read-only: one clear line, the previous checkpoint kept.

The file systems are real: a tiny tmpfs, filled up or remounted read-only (root ignores
file modes, so ``chmod`` would prove nothing). Mounting needs root; elsewhere the tests
are skipped with that reason (under ``CI=true`` they fail with it instead).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from storage import Checkpoint, CheckpointState, Trial, session_scope
from tests.conftest import cannot_run_here
from trials.checkpoint_storage import CheckpointStorageError
from trials.runtime._checkpoint import read_checkpoint, write_checkpoint

from .conftest import TrialHandle, run_torchrun


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        cannot_run_here("mounting a tmpfs (a disk that fills up) needs root")
    target = tmp_path / "mnt"
    target.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target))
    except subprocess.CalledProcessError as error:
        cannot_run_here(f"cannot mount a tmpfs here: {error.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False, timeout=30)


def _fill(folder: Path) -> None:
    """Write a file until the file system has no space left."""
    with open(folder / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def _make_read_only(folder: Path) -> None:
    _mount("-o", "remount,ro", str(folder))


def _state(n: int) -> dict[str, torch.Tensor]:
    return {"weights": torch.arange(n, dtype=torch.float32)}


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [(_fill, "No space left on device"), (_make_read_only, "Read-only file system")],
)
def test_a_failed_write_names_the_folder_and_keeps_the_previous_checkpoint(
    small_tmpfs: Path, spoil: Callable[[Path], None], reason: str
) -> None:
    folder = small_tmpfs / "7" / "3"
    previous, _ = write_checkpoint(folder, "before", _state(100), {"step": 1})
    spoil(small_tmpfs)
    with pytest.raises(CheckpointStorageError) as error:
        write_checkpoint(folder, "after", _state(50_000), {"step": 2})
    assert str(error.value) == f"checkpoint_storage.path {folder}: {reason}"
    assert sorted(p.name for p in folder.iterdir()) == ["before"]  # no temporary left
    torch.testing.assert_close(read_checkpoint(previous)["weights"], _state(100)["weights"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spoil", "reason"),
    [(_fill, "No space left on device"), (_make_read_only, "Read-only file system")],
)
def test_a_trial_whose_checkpoint_folder_breaks_fails_with_one_line(
    make_trial: Callable[..., TrialHandle],
    small_tmpfs: Path,
    spoil: Callable[[Path], None],
    reason: str,
) -> None:
    handle = make_trial(
        slots_per_trial=1,
        max_length={"batches": 400},
        min_checkpoint_period={"batches": 4},
        checkpoint_storage={"path": str(small_tmpfs)},
        hparams={"global_batch_size": 8, "sleep_s": 0.02},
    )
    trial_id, db_url = handle.spec.trial_id, handle.db_url

    def spoil_after_the_first_checkpoint() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with session_scope(db_url) as session:
                if session.scalar(select(Checkpoint.id).where(Checkpoint.trial_id == trial_id)):
                    break
            time.sleep(0.05)
        spoil(small_tmpfs)

    spoiler = threading.Thread(target=spoil_after_the_first_checkpoint, daemon=True)
    spoiler.start()
    result = run_torchrun(
        ["-m", "trials.node.worker"],
        nproc=1,
        env={"SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text()},
    )
    spoiler.join()
    output = result.stdout + result.stderr
    folder = small_tmpfs / handle.spec.checkpoint_folder / str(trial_id)
    line = f"[rank 0] slotsweep: checkpoint_storage.path {folder}: {reason}"
    assert result.returncode != 0
    assert output.count(line) == 1, output[-3000:]
    assert "Traceback" not in output.split(line)[0]
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None and trial.finished_at is None
        latest = session.scalars(
            select(Checkpoint)
            .where(Checkpoint.trial_id == trial_id, Checkpoint.state == CheckpointState.COMPLETED)
            .order_by(Checkpoint.step.desc())
        ).first()
    assert latest is not None
    assert read_checkpoint(latest.path)["kind"] == "managed"  # the previous one still loads
    assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]
