from __future__ import annotations

from trials.retention import CheckpointRecord, checkpoints_to_delete, checkpoints_to_keep


def records(trial_id: int, metrics: list[float | None]) -> list[CheckpointRecord]:
    return [
        CheckpointRecord(f"t{trial_id}-s{i}", trial_id, i, m) for i, m in enumerate(metrics, 1)
    ]


def keep(mine, everyone=None, running=False, **counts):  # type: ignore[no-untyped-def]
    settings = {"save_trial_latest": 0, "save_trial_best": 0, "save_experiment_best": 0, **counts}
    return sorted(
        checkpoints_to_keep(
            mine, everyone or mine, smaller_is_better=True, trial_running=running, **settings
        )
    )


def test_latest_and_best_are_kept() -> None:
    mine = records(1, [0.9, 0.2, 0.5, 0.7])
    assert keep(mine, save_trial_latest=1, save_trial_best=1) == ["t1-s2", "t1-s4"]
    assert keep(mine, save_trial_latest=2) == ["t1-s3", "t1-s4"]
    assert keep(mine, save_trial_best=2) == ["t1-s2", "t1-s3"]


def test_larger_is_better_and_unscored_checkpoints_are_never_best() -> None:
    mine = records(1, [0.9, None, 0.5])
    kept = checkpoints_to_keep(
        mine,
        mine,
        save_trial_latest=0,
        save_trial_best=1,
        save_experiment_best=0,
        smaller_is_better=False,
        trial_running=False,
    )
    assert kept == {"t1-s1"}


def test_a_running_trial_keeps_its_newest_even_with_nothing_to_save() -> None:
    mine = records(1, [0.1, 0.2])
    assert keep(mine, running=True) == ["t1-s2"]
    assert keep(mine, running=False) == []


def test_experiment_best_keeps_only_this_trials_share() -> None:
    mine = records(1, [0.5, 0.4])
    others = records(2, [0.1, 0.45])
    everyone = mine + others
    assert keep(mine, everyone, save_experiment_best=1) == []  # trial 2's 0.1 is the best
    assert keep(mine, everyone, save_experiment_best=2) == ["t1-s2"]  # then this trial's 0.4


def test_delete_list_is_the_complement_oldest_first() -> None:
    mine = records(1, [0.9, 0.2, 0.5, 0.7])
    doomed = checkpoints_to_delete(
        mine,
        mine,
        save_trial_latest=1,
        save_trial_best=1,
        save_experiment_best=0,
        smaller_is_better=True,
        trial_running=False,
    )
    assert [r.uuid for r in doomed] == ["t1-s1", "t1-s3"]
