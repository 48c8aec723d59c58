from __future__ import annotations

from pathlib import Path

from tests.conftest import add_experiment
from trials import CheckpointStorageConfig
from trials.retention import (
    CheckpointRecord,
    checkpoints_to_delete,
    checkpoints_to_keep,
    collect_garbage,
)


def records(trial_id: int, metrics: list[float | None]) -> list[CheckpointRecord]:
    return [
        CheckpointRecord(f"t{trial_id}-s{i}", trial_id, i, m) for i, m in enumerate(metrics, 1)
    ]


def keep(mine, everyone=None, pinned=(), **counts):  # type: ignore[no-untyped-def]
    settings = {"save_trial_latest": 0, "save_trial_best": 0, "save_experiment_best": 0, **counts}
    return sorted(
        checkpoints_to_keep(
            mine, everyone or mine, smaller_is_better=True, pinned=pinned, **settings
        )
    )


def test_latest_and_best_are_kept() -> None:
    mine = records(1, [0.9, 0.2, 0.5, 0.7])
    assert keep(mine, save_trial_latest=1, save_trial_best=1) == ["t1-s2", "t1-s4"]
    assert keep(mine, save_trial_latest=2) == ["t1-s3", "t1-s4"]
    assert keep(mine, save_trial_best=2) == ["t1-s2", "t1-s3", "t1-s4"]  # and the newest


def test_larger_is_better_and_unscored_checkpoints_are_never_best() -> None:
    mine = records(1, [0.9, None, 0.5])
    kept = checkpoints_to_keep(
        mine,
        mine,
        save_trial_latest=0,
        save_trial_best=1,
        save_experiment_best=0,
        smaller_is_better=False,
    )
    assert kept == {"t1-s1", "t1-s3"}  # the best, and the newest


def test_the_newest_is_kept_whatever_the_policy_says() -> None:
    mine = records(1, [0.1, 0.2])
    assert keep(mine) == ["t1-s2"]
    # Two records of one step (an orphaned attempt's duplicate): the later one is newest.
    twins = [CheckpointRecord("early", 1, 5), CheckpointRecord("late", 1, 5)]
    assert keep(twins) == ["late"]


def test_pinned_checkpoints_are_kept_but_only_the_trials_own() -> None:
    mine = records(1, [0.1, 0.2, 0.3])
    assert keep(mine, pinned={"t1-s1", "t2-s1"}) == ["t1-s1", "t1-s3"]


def test_experiment_best_keeps_only_this_trials_share() -> None:
    mine = records(1, [0.5, 0.4, 0.9])
    others = records(2, [0.1, 0.45])
    everyone = mine + others
    # Trial 2's 0.1 is the best; t1-s3 stays anyway as trial 1's newest.
    assert keep(mine, everyone, save_experiment_best=1) == ["t1-s3"]
    assert keep(mine, everyone, save_experiment_best=2) == ["t1-s2", "t1-s3"]


def test_delete_list_is_the_complement_oldest_first() -> None:
    mine = records(1, [0.9, 0.2, 0.5, 0.7])
    doomed = checkpoints_to_delete(
        mine,
        mine,
        save_trial_latest=1,
        save_trial_best=1,
        save_experiment_best=0,
        smaller_is_better=True,
    )
    assert [r.uuid for r in doomed] == ["t1-s1", "t1-s3"]


def _checkpoint_on_disk(db_url: str, tmp_path: Path, trial_id: int, uuid: str, step: int) -> Path:
    from storage import Checkpoint, CheckpointState, session_scope

    folder = tmp_path / uuid
    folder.mkdir()
    (folder / "state.pt").write_bytes(b"x")
    with session_scope(db_url) as session:
        session.add(
            Checkpoint(
                uuid=uuid,
                trial_id=trial_id,
                step=step,
                path=str(folder),
                metrics={"val_loss": 1.0 / step},
                state=CheckpointState.COMPLETED,
            )
        )
    return folder


def test_collect_garbage_spares_the_newest_and_what_a_live_run_restores(
    db_url: str, tmp_path: Path
) -> None:
    from sqlalchemy import select, update

    from storage import Checkpoint, CheckpointState, TrialRun, session_scope, utcnow

    experiment_id, (trial_id,) = add_experiment(db_url)
    folders = {
        step: _checkpoint_on_disk(db_url, tmp_path, trial_id, f"c{step}", step)
        for step in (10, 20, 30, 40)
    }
    with session_scope(db_url) as session:
        # Attempt 0 ended; attempt 1 still runs, restoring from c10; attempt 0's
        # restore source (c20) is no longer needed.
        session.add(
            TrialRun(
                trial_id=trial_id, attempt=0, ended_at=utcnow(), restored_from_checkpoint="c20"
            )
        )
        session.add(TrialRun(trial_id=trial_id, attempt=1, restored_from_checkpoint="c10"))
    policy = CheckpointStorageConfig(
        path=str(tmp_path), save_trial_latest=0, save_trial_best=0, save_experiment_best=0
    )
    with session_scope(db_url) as session:
        deleted = collect_garbage(
            session,
            experiment_id=experiment_id,
            policy=policy,
            metric="val_loss",
            smaller_is_better=True,
            trial_id=trial_id,
        )
    assert deleted == ["c20", "c30"]
    with session_scope(db_url) as session:
        states = {
            uuid: state
            for uuid, state in session.execute(select(Checkpoint.uuid, Checkpoint.state))
        }
    assert states == {
        "c10": CheckpointState.COMPLETED,
        "c20": CheckpointState.DELETED,
        "c30": CheckpointState.DELETED,
        "c40": CheckpointState.COMPLETED,
    }
    assert [step for step, folder in folders.items() if folder.exists()] == [10, 40]

    # Once attempt 1 has ended, the driver's final sweep may take c10 as well.
    with session_scope(db_url) as session:
        session.execute(update(TrialRun).where(TrialRun.attempt == 1).values(ended_at=utcnow()))
        deleted = collect_garbage(
            session,
            experiment_id=experiment_id,
            policy=policy,
            metric="val_loss",
            smaller_is_better=True,
        )
    assert deleted == ["c10"]
    assert not folders[10].exists() and folders[40].exists()
