"""A restore that meets a damaged checkpoint: it falls back, or starts over, and says so.

Real trials on a real SQLite database and real checkpoint folders: one rank in this
process for the cases (the newest checkpoint truncated, every checkpoint damaged, the
core API, a checkpoint the trial's code no longer fits), and one two-rank job under
``torchrun`` for the collective decision. The store-level checks (which damage is
found, and how it is named) are in ``test_checkpoint.py``; the same on S3 in
``test_checkpoint_bucket.py``; whole searches in ``tests/searcher/test_damaged_checkpoints.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage import (
    Checkpoint,
    CheckpointState,
    Metric,
    MetricKind,
    TrialFailure,
    TrialRun,
    session_scope,
)
from trials.checkpoint_storage import MANIFEST_FILE
from trials.config import MaxLength
from trials.runtime._checkpoint import STATE_FILE, CheckpointMismatchError
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial

from .conftest import TrialHandle, run_worker

# A fallback replays the steps after the checkpoint it restores: Optuna keeps their first
# values, and the trial's log gets no warning for each step told again.
pytestmark = pytest.mark.filterwarnings("error:The reported value is ignored:UserWarning")

SINGLE = DistributedInfo()
# 64 samples, 4 per batch on one rank: 16 batches an epoch; a checkpoint every 4, and
# retention keeping them all.
COMMON: dict[str, Any] = {
    "hparams": {"global_batch_size": 4},
    "min_validation_period": {"batches": 4},
    "min_checkpoint_period": {"batches": 4},
    "slots_per_trial": 1,
    "profiling": {"enabled": False},
}


@pytest.fixture
def make_trial(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> Callable[..., TrialHandle]:
    """The runtime's ``make_trial`` with :data:`COMMON` and every checkpoint kept."""

    def make(**fields: Any) -> TrialHandle:
        storage = {"path": str(tmp_path / "checkpoints"), "save_trial_latest": 100}
        return make_trial(**{**COMMON, "checkpoint_storage": storage, **fields})

    return make


def series(db_url: str, trial_id: int, name: str, kind: MetricKind) -> dict[int, float | None]:
    with session_scope(db_url) as session:
        rows = session.scalars(
            select(Metric).where(
                Metric.trial_id == trial_id, Metric.name == name, Metric.kind == kind
            )
        )
        return {row.step: row.value for row in rows}


def trajectory(handle: TrialHandle) -> tuple[dict[int, float | None], dict[int, float | None]]:
    """The trial's recorded training losses and validation losses, by step."""
    url, trial_id = handle.db_url, handle.spec.trial_id
    return (
        series(url, trial_id, "loss", MetricKind.TRAINING),
        series(url, trial_id, "val_loss", MetricKind.VALIDATION),
    )


def checkpoints(db_url: str, trial_id: int) -> list[Checkpoint]:
    with session_scope(db_url) as session:
        rows = list(
            session.scalars(
                select(Checkpoint)
                .where(Checkpoint.trial_id == trial_id)
                .order_by(Checkpoint.step, Checkpoint.id)
            )
        )
        session.expunge_all()
    return rows


def run_row(db_url: str, trial_id: int, attempt: int) -> TrialRun:
    with session_scope(db_url) as session:
        run = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trial_id, TrialRun.attempt == attempt)
        ).one()
        session.expunge(run)
    return run


def truncate(checkpoint: Checkpoint, size: int = 64) -> None:
    with open(Path(checkpoint.path) / STATE_FILE, "r+b") as f:
        f.truncate(size)


def first_attempt(make_trial: Callable[..., TrialHandle], batches: int) -> TrialHandle:
    """A trial of ``batches`` stopped after its step-8 checkpoint (a checkpoint every 4,
    and one where it stopped: rank 0 hears of the request a report or a few later), as
    a crash or a pause leaves it."""
    handle = make_trial(
        max_length={"batches": batches}, hparams={**COMMON["hparams"], "preempt_at_step": 9}
    )
    assert run_trial(handle.spec, SINGLE) == "preempted"
    steps = [c.step for c in checkpoints(handle.db_url, handle.spec.trial_id)]
    assert steps[:2] == [4, 8] and 9 < steps[-1] < batches, steps
    return handle


def restart(handle: TrialHandle, batches: int, **changes: Any) -> TrialHandle:
    """The driver's next attempt: from the newest COMPLETED checkpoint, trained to ``batches``."""
    newest = [
        c
        for c in checkpoints(handle.db_url, handle.spec.trial_id)
        if c.state == CheckpointState.COMPLETED
    ][-1]
    return handle.with_changes(
        attempt=handle.spec.attempt + 1,
        restore_checkpoint_path=newest.path,
        max_length=MaxLength(batches=batches),
        **changes,
    )


def test_truncated_newest_checkpoints_fall_back_to_the_newest_intact_one(
    make_trial: Callable[..., TrialHandle], capfd: pytest.CaptureFixture[str]
) -> None:
    reference = make_trial(max_length={"batches": 16})
    assert run_trial(reference.spec, SINGLE) == "finished"
    handle = first_attempt(make_trial, 16)
    url, trial_id = handle.db_url, handle.spec.trial_id
    _four, eight, *newer = checkpoints(url, trial_id)
    problems = {}
    for checkpoint in newer:
        size = (Path(checkpoint.path) / STATE_FILE).stat().st_size
        truncate(checkpoint)
        problems[checkpoint.uuid] = f"state.pt: 64 bytes, its manifest says {size}"
    capfd.readouterr()

    restarted = restart(handle, 16)
    assert run_trial(restarted.spec, SINGLE) == "finished"

    # The damaged ones are kept, marked, and say why; the attempt continued from step 8
    # and its run says which checkpoints it skipped and why, newest first.
    rows = {c.uuid: c for c in checkpoints(url, trial_id)}
    assert {u: (rows[u].state, rows[u].problem) for u in problems} == {
        u: (CheckpointState.CORRUPTED, p) for u, p in problems.items()
    }
    for checkpoint in newer:  # kept for inspection, as they were found
        assert (Path(checkpoint.path) / STATE_FILE).stat().st_size == 64
    run = run_row(url, trial_id, 1)
    assert (run.restored_from_checkpoint, run.restored_from_step) == (eight.uuid, 8)
    names = {c.uuid: f"the checkpoint of step {c.step} ({c.uuid[:8]})" for c in newer}
    skipped = "; ".join(f"{names[c.uuid]}: {problems[c.uuid]}" for c in reversed(newer))
    assert run.reason == f"continued from the checkpoint of step 8; skipped {skipped}"
    # Rank 0's lines, which the trial's log gets: one per skipped checkpoint, then the note.
    err = capfd.readouterr().err
    newest = newer[-1]
    assert (
        f"slotsweep: {names[newest.uuid]} is damaged and was skipped (kept, marked CORRUPTED): "
        f"{problems[newest.uuid]}; restoring "
    ) in err
    assert f"restoring the checkpoint of step 8 ({eight.uuid[:8]}) instead" in err
    assert f"slotsweep: {run.reason}" in err
    # The steps after 8 were trained again from step 8's state: exactly the uninterrupted
    # run's trajectory, each step recorded once.
    assert trajectory(restarted) == trajectory(reference)
    assert sorted(trajectory(restarted)[0]) == list(range(1, 17))
    live = [c.step for c in checkpoints(url, trial_id) if c.state == CheckpointState.COMPLETED]
    assert live == [4, 8, 12, 16]


def test_every_checkpoint_damaged_starts_the_trial_over(
    make_trial: Callable[..., TrialHandle],
) -> None:
    reference = make_trial(max_length={"batches": 16})
    assert run_trial(reference.spec, SINGLE) == "finished"
    handle = first_attempt(make_trial, 16)
    url, trial_id = handle.db_url, handle.spec.trial_id
    four, eight, *newer = checkpoints(url, trial_id)
    for checkpoint in newer:
        truncate(checkpoint)
    (Path(eight.path) / STATE_FILE).unlink()  # a manifest naming a file that is not there
    (Path(four.path) / MANIFEST_FILE).write_text("{")

    restarted = restart(handle, 16)
    assert run_trial(restarted.spec, SINGLE) == "finished"

    rows = checkpoints(url, trial_id)
    damaged = {c.uuid: c.problem or "" for c in rows if c.state == CheckpointState.CORRUPTED}
    assert damaged.keys() == {c.uuid for c in (four, eight, *newer)}
    assert damaged[eight.uuid] == "state.pt is missing (its manifest names it)"
    assert damaged[four.uuid] == "MANIFEST.json cannot be read"
    assert all(damaged[c.uuid].startswith("state.pt: 64 bytes, its manifest says") for c in newer)
    run = run_row(url, trial_id, 1)
    assert (run.restored_from_checkpoint, run.restored_from_step) == (None, None)
    assert run.reason is not None
    assert run.reason.startswith(
        "started over from step 0: every checkpoint was damaged; skipped "
    )
    for checkpoint in (four, eight, *newer):
        assert f"the checkpoint of step {checkpoint.step} ({checkpoint.uuid[:8]})" in run.reason
    # The whole trial trained again, the abandoned records replaced: the same trajectory.
    assert trajectory(restarted) == trajectory(reference)
    live = [c.step for c in rows if c.state == CheckpointState.COMPLETED]
    assert live == [4, 8, 12, 16]


@pytest.mark.parametrize(
    ("changed", "cause"),
    [
        ({"hidden_size": 8}, "size mismatch for 0.weight: copying a param with shape"),
        ({"linear": True}, "it holds 1 lr_schedulers, the trial wraps 0"),
    ],
    ids=["shapes", "state"],
)
def test_a_checkpoint_the_trial_no_longer_fits_fails_the_attempt_in_one_line(
    make_trial: Callable[..., TrialHandle], changed: dict[str, Any], cause: str
) -> None:
    """Not damage: the trial's code changed (its model's shapes, what it wraps). Every
    older checkpoint would fail alike, so nothing is skipped, nothing marked, and the
    attempt fails, recording a reason that says so (unlike a skipped checkpoint's)."""
    handle = first_attempt(make_trial, 16)
    url, trial_id = handle.db_url, handle.spec.trial_id
    newest = checkpoints(url, trial_id)[-1]
    attempt = restart(handle, 16, hparams={"global_batch_size": 4, **changed})
    with pytest.raises(CheckpointMismatchError) as raised:
        run_trial(attempt.spec, SINGLE)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint {newest.path} does not fit the trial: ")
    assert cause in message
    assert {c.state for c in checkpoints(url, trial_id)} == {CheckpointState.COMPLETED}
    run = run_row(url, trial_id, 1)
    assert run.restored_from_step == newest.step and run.reason is None
    with session_scope(url) as session:
        failure = session.scalars(select(TrialFailure).where(TrialFailure.run_id == run.id)).one()
        assert (failure.exception_type, failure.message) == ("CheckpointMismatchError", message)


def test_the_core_api_falls_back_too(make_trial: Callable[..., TrialHandle]) -> None:
    """``load_latest_checkpoint`` returns the newest intact checkpoint, whatever its loop."""
    handle = make_trial(entrypoint="runtime_trials:core_main")
    assert run_trial(handle.spec, SINGLE) == "finished"  # saves the weight at step 3
    second = restart(handle, 12)
    assert run_trial(second.spec, SINGLE) == "finished"  # from step 3, saves at step 6
    url, trial_id = handle.db_url, handle.spec.trial_id
    _three, six = checkpoints(url, trial_id)
    truncate(six)
    third = restart(second, 12)
    assert run_trial(third.spec, SINGLE) == "finished"
    core = json.loads((Path(third.spec.scratch_dir) / "rank-0" / "core.json").read_text())
    assert (core["start"], core["weight"]) == (3, [3.0, 3.0, 3.0])
    assert {c.uuid: c.state for c in checkpoints(url, trial_id)}[six.uuid] == (
        CheckpointState.CORRUPTED
    )
    assert run_row(url, trial_id, 2).restored_from_step == 3


@pytest.mark.slow
def test_two_ranks_fall_back_together(make_trial: Callable[..., TrialHandle]) -> None:
    """Rank 0 decides and every rank loads the same older checkpoint: the job trains on
    as the uninterrupted one did."""
    common = {"hparams": {"global_batch_size": 8}, "slots_per_trial": 2}
    reference = make_trial(max_length={"batches": 8}, **common)
    assert run_worker(reference).returncode == 0
    handle = make_trial(max_length={"batches": 8}, **common)
    assert run_worker(handle).returncode == 0
    url, trial_id = handle.db_url, handle.spec.trial_id
    _four, eight = checkpoints(url, trial_id)
    truncate(eight, 1000)
    restarted = restart(handle, 8)
    result = run_worker(restarted)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert f"[rank 0] slotsweep: the checkpoint of step 8 ({eight.uuid[:8]}) is damaged" in log
    assert "[rank 1] slotsweep: the checkpoint of step 8" not in log  # rank 0 says it, once
    assert run_row(url, trial_id, 1).restored_from_step == 4
    assert trajectory(restarted) == trajectory(reference)
    resumed = [_digests(restarted, rank) for rank in (0, 1)]
    assert min(resumed[0]) == 4 and resumed[0] == resumed[1]


def _digests(handle: TrialHandle, rank: int) -> dict[int, dict[str, Any]]:
    path = (
        Path(handle.spec.scratch_dir)
        / f"rank-{rank}"
        / f"digests-attempt{handle.spec.attempt}.jsonl"
    )
    return {d["step"]: d for d in map(json.loads, path.read_text().splitlines())}
