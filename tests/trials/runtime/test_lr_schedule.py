from __future__ import annotations

import io
import math
import warnings
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LRScheduler

from trials.runtime._lr_schedule import build_lr_scheduler
from trials.runtime._optimizers import build_optimizer

LR = 0.8


def _optimizer(lr: float = LR) -> torch.optim.Optimizer:
    torch.manual_seed(0)
    return torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=lr, momentum=0.9)


def _two_group_optimizer() -> torch.optim.Optimizer:
    """Weights at lr 1.0, the bias at the optimizer's default 0.2."""
    model = torch.nn.Linear(3, 2)
    groups: list[dict[str, Any]] = [
        {"params": [model.weight], "lr": 1.0},
        {"params": [model.bias]},
    ]
    return torch.optim.SGD(groups, lr=0.2)


def _lrs(
    opt: torch.optim.Optimizer, sched: LRScheduler, steps: int, group: int = 0
) -> list[float]:
    """The lr used by optimizer steps 0..steps-1 (before each step), as a training loop sees it."""
    seen = []
    for _ in range(steps):
        seen.append(float(opt.param_groups[group]["lr"]))
        opt.step()
        sched.step()
    return seen


def _warmup(t: int, warmup: int, start: float = 0.1, lr: float = LR) -> float:
    return lr * (start + (1 - start) * t / warmup)


def _cosine(t: int, warmup: int, total: int, lr_min: float = 0.0, lr: float = LR) -> float:
    return lr_min + (lr - lr_min) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2


def test_no_hparams_keeps_the_lr_constant() -> None:
    opt = _optimizer()
    sched = build_lr_scheduler(opt, {}, steps_per_epoch=5, total_steps=20)
    assert _lrs(opt, sched, 20) == pytest.approx([LR] * 20)


def test_warmup_steps_then_constant() -> None:
    opt = _optimizer()
    sched = build_lr_scheduler(opt, {"warmup_steps": 8}, steps_per_epoch=5, total_steps=30)
    expected = [_warmup(t, 8) for t in range(8)] + [LR] * 22
    assert _lrs(opt, sched, 30) == pytest.approx(expected)


def test_warmup_epochs_count_steps_per_epoch() -> None:
    # Goyal et al.: 5 epochs of warmup; here 2.5 epochs of 4 steps = 10 steps.
    opt = _optimizer()
    hparams = {"warmup_epochs": 2.5, "warmup_start_factor": 0.25}
    sched = build_lr_scheduler(opt, hparams, steps_per_epoch=4, total_steps=16)
    expected = [_warmup(t, 10, start=0.25) for t in range(10)] + [LR] * 6
    assert _lrs(opt, sched, 16) == pytest.approx(expected)


def test_warmup_then_cosine_reaches_the_floor_at_total_steps() -> None:
    opt = _optimizer()
    hparams = {"warmup_steps": 5, "lr_decay": "cosine", "lr_min_factor": 0.1}
    sched = build_lr_scheduler(opt, hparams, steps_per_epoch=10, total_steps=25)
    expected = [_warmup(t, 5) for t in range(5)] + [
        _cosine(t, 5, 25, lr_min=0.1 * LR) for t in range(5, 26)
    ]
    got = _lrs(opt, sched, 26)
    assert got == pytest.approx(expected)
    assert got[25] == pytest.approx(0.1 * LR)


def test_cosine_without_warmup_decays_to_zero_by_default() -> None:
    opt = _optimizer()
    sched = build_lr_scheduler(opt, {"lr_decay": "cosine"}, steps_per_epoch=3, total_steps=12)
    got = _lrs(opt, sched, 13)
    assert got == pytest.approx([_cosine(t, 0, 12) for t in range(13)], abs=1e-12)
    assert got[12] == pytest.approx(0.0, abs=1e-12)


def test_warmup_then_step_decay_every_n_epochs_after_warmup() -> None:
    opt = _optimizer()
    hparams = {
        "warmup_epochs": 1,
        "lr_decay": "step",
        "lr_step_epochs": 2,
        "lr_step_gamma": 0.5,
    }
    sched = build_lr_scheduler(opt, hparams, steps_per_epoch=4, total_steps=30)
    expected = [_warmup(t, 4) for t in range(4)] + [
        LR * 0.5 ** ((t - 4) // 8) for t in range(4, 30)
    ]
    assert _lrs(opt, sched, 30) == pytest.approx(expected)


def test_step_decay_without_warmup_uses_default_gamma() -> None:
    opt = _optimizer()
    hparams = {"warmup_epochs": 0, "lr_decay": "step", "lr_step_epochs": 1}
    sched = build_lr_scheduler(opt, hparams, steps_per_epoch=3, total_steps=9)
    assert _lrs(opt, sched, 9) == pytest.approx([LR * 0.1 ** (t // 3) for t in range(9)])


def test_zero_warmup_steps_is_no_warmup() -> None:
    opt = _optimizer()
    sched = build_lr_scheduler(
        opt, {"warmup_steps": 0, "lr_decay": "constant"}, steps_per_epoch=3, total_steps=6
    )
    assert _lrs(opt, sched, 6) == pytest.approx([LR] * 6)


def test_every_param_group_warms_up_to_its_own_lr() -> None:
    opt = _two_group_optimizer()
    sched = build_lr_scheduler(
        opt, {"warmup_steps": 4, "lr_decay": "cosine"}, steps_per_epoch=2, total_steps=8
    )
    seen = []
    for _ in range(9):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    for t, (weight_lr, bias_lr) in enumerate(seen):
        if t < 4:
            assert (weight_lr, bias_lr) == pytest.approx(
                (_warmup(t, 4, lr=1.0), _warmup(t, 4, lr=0.2))
            )
        else:
            assert (weight_lr, bias_lr) == pytest.approx(
                (_cosine(t, 4, 8, lr=1.0), _cosine(t, 4, 8, lr=0.2)), abs=1e-12
            )


def test_schedule_runs_on_the_optimizers_build_optimizer_makes() -> None:
    # LARS comes from pytorch-optimizer; torch's schedulers must drive it too.
    torch.manual_seed(0)
    opt = build_optimizer(
        torch.nn.Linear(3, 2).parameters(),
        {"optimizer": "lars", "lr": 0.1, "lr_scaling": "linear"},
        global_batch_size=1024,
        world_size=4,
    )
    hparams = {"warmup_steps": 3, "lr_decay": "cosine"}
    sched = build_lr_scheduler(opt, hparams, steps_per_epoch=2, total_steps=7)
    expected = [_warmup(t, 3, lr=0.4) for t in range(3)] + [
        _cosine(t, 3, 7, lr=0.4) for t in range(3, 8)
    ]
    assert _lrs(opt, sched, 8) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "hparams",
    [
        {"warmup_steps": 4},
        {"warmup_steps": 4, "lr_decay": "cosine", "lr_min_factor": 0.05},
        {"warmup_epochs": 1, "lr_decay": "step", "lr_step_epochs": 1},
        {"lr_decay": "cosine"},
        {"lr_decay": "step", "lr_step_epochs": 0.5},
    ],
)
@pytest.mark.parametrize("stop_at", [2, 4, 9])
def test_state_dict_round_trips_through_a_checkpoint(
    hparams: dict[str, Any], stop_at: int
) -> None:
    total = 16

    def build() -> tuple[torch.optim.Optimizer, LRScheduler]:
        opt = _optimizer()
        return opt, build_lr_scheduler(opt, hparams, steps_per_epoch=4, total_steps=total)

    opt, sched = build()
    uninterrupted = _lrs(opt, sched, total)

    opt, sched = build()
    before = _lrs(opt, sched, stop_at)
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()}, buffer)
    buffer.seek(0)
    # Checkpoints are read with weights_only=True, so the state must be plain data.
    saved = torch.load(buffer, weights_only=True)

    opt, sched = build()
    opt.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["lr_scheduler"])
    after = _lrs(opt, sched, total - stop_at)
    assert before + after == pytest.approx(uninterrupted, abs=1e-12)


def test_stepping_after_the_optimizer_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = _optimizer()
        sched = build_lr_scheduler(
            opt, {"warmup_steps": 2, "lr_decay": "cosine"}, steps_per_epoch=2, total_steps=6
        )
        _lrs(opt, sched, 6)
        sched.load_state_dict(sched.state_dict())


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        ({"lr_decay": "linear"}, "hparam 'lr_decay' must be one of constant, cosine, step"),
        ({"warmup_epochs": 1, "warmup_steps": 4}, "at most one of hparams 'warmup_epochs'"),
        ({"warmup_steps": -1}, "hparam 'warmup_steps' must be an integer >= 0"),
        ({"warmup_steps": 2.5}, "hparam 'warmup_steps' must be an integer >= 0"),
        ({"warmup_epochs": -1}, "hparam 'warmup_epochs' must be a number >= 0"),
        ({"warmup_epochs": "5"}, "hparam 'warmup_epochs' must be a number >= 0"),
        ({"warmup_start_factor": 0}, r"hparam 'warmup_start_factor' must be a number in \(0, 1\]"),
        ({"warmup_start_factor": 1.5}, "hparam 'warmup_start_factor'"),
        ({"lr_decay": "step"}, "hparam 'lr_step_epochs' is required when lr_decay is 'step'"),
        (
            {"lr_decay": "step", "lr_step_epochs": 0},
            "hparam 'lr_step_epochs' must be a number > 0",
        ),
        (
            {"lr_decay": "step", "lr_step_epochs": 1, "lr_step_gamma": 0},
            "hparam 'lr_step_gamma' must be a number in",
        ),
        (
            {"lr_decay": "cosine", "lr_min_factor": 2},
            r"hparam 'lr_min_factor' must be a number in \[0, 1\]",
        ),
    ],
)
def test_bad_hparams_raise_one_clear_line(hparams: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        build_lr_scheduler(_optimizer(), hparams, steps_per_epoch=4, total_steps=20)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps_per_epoch": 0, "total_steps": 10}, "steps_per_epoch must be an integer >= 1"),
        ({"steps_per_epoch": 4, "total_steps": -1}, "total_steps must be an integer >= 0"),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_lr_scheduler(_optimizer(), {}, **kwargs)


def test_cosine_floor_needs_one_shared_lr() -> None:
    opt = _two_group_optimizer()
    with pytest.raises(ValueError, match="'lr_min_factor' above 0 needs every param group"):
        build_lr_scheduler(
            opt, {"lr_decay": "cosine", "lr_min_factor": 0.1}, steps_per_epoch=2, total_steps=8
        )
