from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from storage import Checkpoint, CheckpointState, Experiment, TrialRun, session_scope, utcnow
from tests.conftest import add_experiment, checkpoint_folder
from trials import CheckpointStorageConfig, store_for, trial_checkpoint_dir
from trials.retention import (
    CheckpointRecord,
    checkpoints_to_delete,
    checkpoints_to_keep,
    collect_garbage,
    newest_intact,
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
    deleted = _collect(db_url, experiment_id, policy, trial_id)
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


# ------------------------------------------------- what a crash leaves in a trial's folder


def _write(folder: Path, uuid: str) -> Path:
    """A whole checkpoint ``uuid`` in ``folder``, written as rank 0 writes one."""
    location, _ = store_for(str(folder)).write(
        str(folder), uuid, {"state.pt": lambda f: f.write(b"x")}
    )
    return Path(location)


def _record(db_url: str, trial_id: int, location: Path, step: int) -> None:
    with session_scope(db_url) as session:
        session.add(
            Checkpoint(
                uuid=location.name,
                trial_id=trial_id,
                step=step,
                path=str(location),
                state=CheckpointState.COMPLETED,
            )
        )


def _run(db_url: str, trial_id: int, *, ended: bool) -> None:
    with session_scope(db_url) as session:
        session.add(TrialRun(trial_id=trial_id, attempt=0, ended_at=utcnow() if ended else None))


def _collect(
    db_url: str, experiment_id: int, policy: CheckpointStorageConfig, trial_id: int | None
) -> list[str]:
    with session_scope(db_url) as session:
        return collect_garbage(
            session,
            experiment_id=experiment_id,
            policy=policy,
            metric="val_loss",
            smaller_is_better=True,
            trial_id=trial_id,
        )


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_two_databases_with_one_checkpoint_path_never_collect_each_others_checkpoints(
    tmp_path: Path,
) -> None:
    """Both databases' experiment 1 has a trial 1; each has a folder of its own, and one's
    collection leaves the other's writes in flight and its whole checkpoints alone."""
    from storage import upgrade_schema

    policy = CheckpointStorageConfig(path=str(tmp_path / "ckpt"))
    urls = [f"sqlite:///{tmp_path / name}.db" for name in ("a", "b")]
    folders = []
    for url in urls:
        upgrade_schema(url)
        assert add_experiment(url) == (1, [1])  # ids count from 1 in every database
        folders.append(Path(trial_checkpoint_dir(policy.path, ".", checkpoint_folder(url, 1), 1)))
    mine, theirs = folders
    assert mine != theirs and mine.parent.parent == theirs.parent.parent == tmp_path / "ckpt"
    assert mine.parent.name.startswith("1-") and theirs.parent.name.startswith("1-")
    # Database b's rank 0 is writing: one checkpoint renamed into place whose row is not
    # committed yet, one still in its temporary folder; one recorded before.
    _run(urls[1], 1, ended=False)
    _record(urls[1], 1, _write(theirs, "b-recorded"), 1)
    _write(theirs, "b-between")
    (theirs / ".tmp-b-writing").mkdir()
    # Database a's trial ended; a crash left one of each behind.
    _run(urls[0], 1, ended=True)
    _record(urls[0], 1, _write(mine, "a-recorded"), 1)
    _write(mine, "a-unrecorded")
    (mine / ".tmp-a-crashed").mkdir()
    for trial_id in (1, None):  # rank 0's collection, then the driver's sweep
        assert _collect(urls[0], 1, policy, trial_id) == []
    assert _names(mine) == ["a-recorded"]
    assert _names(theirs) == [".tmp-b-writing", "b-between", "b-recorded"]


def test_a_whole_checkpoint_no_row_records_is_collected_once_no_run_of_its_trial_runs(
    db_url: str, tmp_path: Path
) -> None:
    experiment_id, (trial_id,) = add_experiment(db_url)
    policy = CheckpointStorageConfig(path=str(tmp_path / "ckpt"))
    folder = Path(
        trial_checkpoint_dir(policy.path, ".", checkpoint_folder(db_url, experiment_id), trial_id)
    )
    # The row records the checkpoint under another spelling of the same folder (a link):
    # it is matched by its uuid, so it is never taken for an orphan.
    (tmp_path / "link").symlink_to(tmp_path / "ckpt")
    recorded = _write(folder, "recorded")
    _record(db_url, trial_id, tmp_path / "link" / recorded.relative_to(tmp_path / "ckpt"), 1)
    # Rank 0 wrote this one and has not recorded it yet, or died before it could: while
    # the run has not ended, nobody can tell which.
    _write(folder, "unrecorded")
    _run(db_url, trial_id, ended=False)
    for only_trial in (trial_id, None):
        assert _collect(db_url, experiment_id, policy, only_trial) == []
        assert _names(folder) == ["recorded", "unrecorded"]
    with session_scope(db_url) as session:
        session.execute(update(TrialRun).values(ended_at=utcnow()))
    assert _collect(db_url, experiment_id, policy, None) == []
    assert _names(folder) == ["recorded"]


def test_an_experiment_from_before_the_checkpoint_key_keeps_and_collects_its_id_folder(
    db_url: str, tmp_path: Path
) -> None:
    """Its checkpoints stay in ``<path>/<id>/`` and retention finds them there; a whole
    checkpoint without a row may be another database's experiment of that id: kept."""
    experiment_id, (trial_id,) = add_experiment(db_url)
    with session_scope(db_url) as session:
        # As revision 0013 leaves an experiment created before it (tests/storage).
        session.execute(update(Experiment).values(checkpoint_key=None))
    assert checkpoint_folder(db_url, experiment_id) == str(experiment_id)
    policy = CheckpointStorageConfig(
        path=str(tmp_path / "ckpt"), save_trial_latest=1, save_trial_best=0
    )
    folder = Path(trial_checkpoint_dir(policy.path, ".", str(experiment_id), trial_id))
    assert folder == tmp_path / "ckpt" / str(experiment_id) / str(trial_id)
    for step in (1, 2):
        _record(db_url, trial_id, _write(folder, f"c{step}"), step)
    _write(folder, "another-databases")
    (folder / ".tmp-crashed").mkdir()
    _run(db_url, trial_id, ended=True)
    assert _collect(db_url, experiment_id, policy, None) == ["c1"]
    assert _names(folder) == ["another-databases", "c2"]


# ----------------------------------------- the newest intact checkpoint is never collected


def test_newest_intact_checks_newest_first_and_stops_at_the_first_intact() -> None:
    ckpts = [CheckpointRecord(f"c{step}", 1, step) for step in (10, 20, 30, 40)]
    asked: list[str] = []

    def problem_of(record: CheckpointRecord) -> str | None:
        asked.append(record.uuid)
        return None if record.uuid in {"c10", "c20"} else f"{record.uuid} is damaged"

    assert newest_intact(ckpts, problem_of) == (
        "c20",
        {"c40": "c40 is damaged", "c30": "c30 is damaged"},
    )
    assert asked == ["c40", "c30", "c20"]  # c10 is never read
    assert newest_intact(ckpts, lambda r: "damaged") == (
        None,
        {f"c{step}": "damaged" for step in (40, 30, 20, 10)},
    )


def _damaged_trial(db_url: str, tmp_path: Path) -> tuple[int, Path]:
    """A trial with checkpoints at steps 10-40 written as rank 0 writes them (manifests
    with digests); the two newest damaged since."""
    experiment_id, (trial_id,) = add_experiment(db_url)
    folder = tmp_path / "ckpt"
    written = {}
    for step in (10, 20, 30, 40):
        written[step] = _write(folder, f"c{step}")
        _record(db_url, trial_id, written[step], step)
    with open(written[40] / "state.pt", "wb"):
        pass  # truncated to nothing
    (written[30] / "state.pt").unlink()
    _run(db_url, trial_id, ended=True)
    return experiment_id, folder


def _states(db_url: str) -> dict[str, tuple[CheckpointState, str | None]]:
    from sqlalchemy import select

    with session_scope(db_url) as session:
        return {
            uuid: (state, problem)
            for uuid, state, problem in session.execute(
                select(Checkpoint.uuid, Checkpoint.state, Checkpoint.problem)
            )
        }


def test_retention_never_deletes_the_newest_intact_checkpoint_for_damaged_newer_ones(
    db_url: str, tmp_path: Path
) -> None:
    experiment_id, folder = _damaged_trial(db_url, tmp_path)
    policy = CheckpointStorageConfig(
        path=str(tmp_path / "ckpt"), save_trial_latest=1, save_trial_best=0
    )
    # The policy alone would keep c40 (the newest) and delete c10-c30.
    assert _collect(db_url, experiment_id, policy, None) == ["c10"]
    assert _states(db_url) == {
        "c10": (CheckpointState.DELETED, None),
        "c20": (CheckpointState.COMPLETED, None),
        "c30": (CheckpointState.CORRUPTED, "state.pt is missing (its manifest names it)"),
        "c40": (CheckpointState.CORRUPTED, "state.pt: 0 bytes, its manifest says 1"),
    }
    # The damaged ones stay for inspection, and no later collection takes them.
    assert _names(folder) == ["c20", "c30", "c40"]
    assert _collect(db_url, experiment_id, policy, None) == []
    assert _names(folder) == ["c20", "c30", "c40"]


def test_a_checkpoint_just_written_whole_is_not_read_back(db_url: str, tmp_path: Path) -> None:
    """Rank 0's collection after its own write: the new checkpoint's digests were taken
    from the bytes written, so it counts as intact without a second read."""
    experiment_id, folder = _damaged_trial(db_url, tmp_path)
    policy = CheckpointStorageConfig(
        path=str(tmp_path / "ckpt"), save_trial_latest=1, save_trial_best=0
    )
    with session_scope(db_url) as session:
        deleted = collect_garbage(
            session,
            experiment_id=experiment_id,
            policy=policy,
            metric="val_loss",
            smaller_is_better=True,
            known_intact={"c40"},
        )
    assert deleted == ["c10", "c20", "c30"]
    assert _names(folder) == ["c40"]
