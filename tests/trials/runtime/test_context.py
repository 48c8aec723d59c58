from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from trials import RuntimeSpec
from trials.runtime import CpuAccelerator, InvalidTrialError, PyTorchTrialContext
from trials.runtime._distributed import DistributedInfo
from trials.runtime._loop import Schedule


def spec(tmp_path: Path, **changes: Any) -> RuntimeSpec:
    fields: dict[str, Any] = {
        "db_url": "sqlite://",
        "experiment_id": 1,
        "checkpoint_folder": "1-5f0c2a9e41b7",
        "trial_id": 2,
        "study_name": "s",
        "optuna_trial_id": 3,
        "optuna_trial_number": 4,
        "entrypoint": "m:T",
        "model_dir": str(tmp_path),
        "hparams": {"global_batch_size": 130, "lr": 0.1},
        "slots_per_trial": 4,
        "max_length": {"epochs": 3},
        "searcher_metric": "val_loss",
        "min_validation_period": {"epochs": 1},
        "scratch_dir": str(tmp_path / "scratch"),
    }
    fields.update(changes)
    return RuntimeSpec.model_validate(fields)


def context(tmp_path: Path, rank: int = 0, world: int = 4, **changes: Any) -> PyTorchTrialContext:
    info = DistributedInfo(rank=rank, local_rank=rank, world_size=world, local_world_size=world)
    return PyTorchTrialContext(spec(tmp_path, **changes), info, CpuAccelerator())


def test_batch_sizes_and_the_dropped_samples_warning(tmp_path: Path) -> None:
    with pytest.warns(
        UserWarning,
        match="global_batch_size 130 is not a multiple of 4 slots.*32 samples.*2 samples",
    ):
        ctx = context(tmp_path)
    assert (ctx.per_slot_batch_size, ctx.global_batch_size) == (32, 130)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        context(tmp_path, rank=1)  # only rank 0 warns


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"lr": 0.1}, "hyperparameters.global_batch_size: required"),
        (
            {"global_batch_size": 64.0},
            "hyperparameters.global_batch_size: must be an integer, got 64.0",
        ),
        (
            {"global_batch_size": 2},
            "hyperparameters.global_batch_size: 2 is smaller than slots_per_trial \\(4\\)",
        ),
    ],
)
def test_bad_global_batch_size_is_one_clear_error(
    tmp_path: Path, hparams: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidTrialError, match=message):
        context(tmp_path, hparams=hparams)


def test_identity_hparams_and_rank_unique_scratch(tmp_path: Path) -> None:
    ctx0 = context(tmp_path, rank=0, hparams={"global_batch_size": 64, "lr": 0.1})
    ctx1 = context(tmp_path, rank=1, hparams={"global_batch_size": 64, "lr": 0.1})
    assert (ctx1.rank, ctx1.world_size, ctx1.is_chief, ctx0.is_chief) == (1, 4, False, True)
    assert ctx0.get_hparam("lr") == 0.1
    with pytest.raises(
        InvalidTrialError,
        match=r"hyperparameters.momentum: not in this trial's hyperparameters \(global_batch_size, lr\)",
    ):
        ctx0.get_hparam("momentum")
    ctx0.hparams["lr"] = 5
    assert ctx0.get_hparam("lr") == 0.1
    assert ctx0.scratch_dir != ctx1.scratch_dir and ctx0.scratch_dir.is_dir()


def test_optimizer_step_counts_for_schedules(tmp_path: Path) -> None:
    ctx = context(
        tmp_path,
        hparams={"global_batch_size": 64},
        optimizations={"aggregation_frequency": 4},
        max_length={"epochs": 3},
    )
    # 1437 samples over 4 ranks: 360 each -> 23 batches of 16 -> 6 optimizer steps per epoch.
    assert ctx.optimizer_steps_per_epoch(1437) == 6
    assert ctx.total_optimizer_steps(1437) == 18
    ctx = context(
        tmp_path,
        hparams={"global_batch_size": 64},
        optimizations={"aggregation_frequency": 4},
        max_length={"batches": 30},
    )
    assert ctx.total_optimizer_steps(1437) == 6 + 2  # 23 batches (6 steps), then 7 (2 steps)


def test_schedule_steps_at_group_ends_epoch_ends_and_the_last_batch() -> None:
    s = Schedule(
        batches_per_epoch=10,
        max_batches=25,
        validation_every=10,
        checkpoint_every=None,
        report_every=100,
        aggregation_frequency=4,
    )
    steps = [step for step in range(25) if s.is_optimizer_step(step % 10, step)]
    assert steps == [3, 7, 9, 13, 17, 19, 23, 24]
