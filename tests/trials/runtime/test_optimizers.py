from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
import torch

from trials.runtime._optimizers import LR_SCALINGS, OPTIMIZERS, build_optimizer, scaled_lr


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


@pytest.mark.parametrize(
    ("lr_scaling", "expected"),
    [
        ("none", 0.1),
        ("linear", 0.1 * 1024 / 256),
        ("sqrt", 0.1 * math.sqrt(1024 / 256)),
        ("world_size", 0.1 * 8),
    ],
)
def test_scaled_lr(lr_scaling: str, expected: float) -> None:
    got = scaled_lr(0.1, lr_scaling, global_batch_size=1024, world_size=8)
    assert got == pytest.approx(expected)


def test_scaled_lr_uses_reference_batch_size() -> None:
    # Goyal et al.: lr 0.1 for 256 images becomes 3.2 for 8192.
    assert scaled_lr(0.1, "linear", global_batch_size=8192) == pytest.approx(3.2)
    assert scaled_lr(
        0.1, "linear", global_batch_size=64, reference_batch_size=32
    ) == pytest.approx(0.2)
    assert scaled_lr(0.4, "sqrt", global_batch_size=64, reference_batch_size=256) == pytest.approx(
        0.2
    )


def test_scaled_lr_rejects_unknown_scaling() -> None:
    with pytest.raises(ValueError, match="lr_scaling") as info:
        scaled_lr(0.1, "cubic", global_batch_size=256)
    for allowed in LR_SCALINGS:
        assert allowed in str(info.value)
    assert "'cubic'" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"global_batch_size": 0}, {"global_batch_size": 256, "reference_batch_size": 0}],
)
def test_scaled_lr_rejects_bad_batch_sizes(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        scaled_lr(0.1, "linear", **kwargs)


def test_scaled_lr_rejects_bad_world_size() -> None:
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        scaled_lr(0.1, "world_size", global_batch_size=256, world_size=0)


def test_default_is_sgd_with_momentum_and_unscaled_lr() -> None:
    opt = build_optimizer(_model().parameters(), {"lr": 0.05}, global_batch_size=512, world_size=2)
    assert type(opt) is torch.optim.SGD
    group = opt.param_groups[0]
    assert group["lr"] == pytest.approx(0.05)
    assert group["momentum"] == pytest.approx(0.9)
    assert group["nesterov"] is False
    assert group["weight_decay"] == 0.0


@pytest.mark.parametrize(
    ("name", "cls_name"),
    [
        ("sgd", "torch.optim.sgd.SGD"),
        ("adam", "torch.optim.adam.Adam"),
        ("adamw", "torch.optim.adamw.AdamW"),
        ("radam", "torch.optim.radam.RAdam"),
        ("lars", "pytorch_optimizer.optimizer.lars.LARS"),
        ("lamb", "pytorch_optimizer.optimizer.lamb.Lamb"),
    ],
)
def test_every_optimizer_gets_the_scaled_lr(name: str, cls_name: str) -> None:
    hparams = {"optimizer": name, "lr": 0.01, "lr_scaling": "linear", "weight_decay": 1e-4}
    opt = build_optimizer(_model().parameters(), hparams, global_batch_size=1024, world_size=4)
    assert f"{type(opt).__module__}.{type(opt).__qualname__}" == cls_name
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.04)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(1e-4)
    assert set(OPTIMIZERS) == {"sgd", "adam", "adamw", "radam", "lars", "lamb"}


def test_sgd_hparams_reach_the_optimizer() -> None:
    hparams = {
        "optimizer": "sgd",
        "lr": 0.2,
        "lr_scaling": "world_size",
        "momentum": 0.8,
        "nesterov": True,
        "weight_decay": 5e-4,
    }
    opt = build_optimizer(_model().parameters(), hparams, global_batch_size=64, world_size=2)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (
        pytest.approx(0.4),
        pytest.approx(0.8),
        True,
        pytest.approx(5e-4),
    )


@pytest.mark.parametrize("name", ["adam", "adamw", "radam", "lamb"])
def test_betas_and_eps_reach_adaptive_optimizers(name: str) -> None:
    hparams = {"optimizer": name, "lr": 1e-3, "betas": [0.8, 0.99], "eps": 1e-7}
    opt = build_optimizer(_model().parameters(), hparams, global_batch_size=32, world_size=1)
    assert tuple(opt.param_groups[0]["betas"]) == (0.8, 0.99)
    assert opt.param_groups[0]["eps"] == pytest.approx(1e-7)


def test_hparams_of_other_optimizers_and_the_model_are_ignored() -> None:
    # A search space may share `momentum` between optimizers and carry model settings.
    hparams = {"optimizer": "adam", "lr": 1e-3, "momentum": 0.5, "hidden_size": 128}
    opt = build_optimizer(_model().parameters(), hparams, global_batch_size=32, world_size=1)
    assert type(opt) is torch.optim.Adam
    assert "momentum" not in opt.param_groups[0]


def test_integer_lr_from_yaml_is_accepted() -> None:
    opt = build_optimizer(_model().parameters(), {"lr": 1}, global_batch_size=32, world_size=1)
    assert opt.param_groups[0]["lr"] == 1.0


def test_sgd_step_matches_hand_computation() -> None:
    # First SGD step with momentum and weight decay: p - lr * (g + wd * p).
    model = _model()
    hparams = {"lr": 0.1, "lr_scaling": "linear", "weight_decay": 0.01}
    opt = build_optimizer(model.parameters(), hparams, global_batch_size=512, world_size=2)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4)).pow(2).mean().backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    opt.step()
    for p0, g, p1 in zip(before, grads, model.parameters(), strict=True):
        torch.testing.assert_close(p1.detach(), p0 - 0.2 * (g + 0.01 * p0))


def test_lars_step_matches_its_layerwise_trust_ratio() -> None:
    # LARS (You et al.): matrices get lr * tc * |p| / (|g| + wd |p|) * (g + wd p);
    # vectors (biases) get plain SGD. The first momentum step equals the update itself.
    model = _model()
    hparams = {
        "optimizer": "lars",
        "lr": 0.5,
        "lr_scaling": "linear",
        "weight_decay": 0.01,
        "trust_coefficient": 0.02,
    }
    opt = build_optimizer(model.parameters(), hparams, global_batch_size=512, world_size=2)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.9)
    lr, wd, tc = 1.0, 0.01, 0.02
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(8, 4)).pow(2).mean().backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    opt.step()
    for p0, g, p1 in zip(before, grads, model.parameters(), strict=True):
        if p0.ndim > 1:
            trust = tc * p0.norm() / (g.norm() + wd * p0.norm())
            expected = p0 - lr * trust * (g + wd * p0)
        else:
            expected = p0 - lr * g
        torch.testing.assert_close(p1.detach(), expected)


@pytest.mark.parametrize(
    ("hparams", "message"),
    [
        (
            {"optimizer": "rmsprop", "lr": 0.1},
            "hparam 'optimizer' must be one of sgd, adam, adamw",
        ),
        ({"optimizer": "SGD", "lr": 0.1}, "hparam 'optimizer' must be one of"),
        ({}, "hparam 'lr' is required"),
        ({"lr": 0}, "hparam 'lr' must be a number > 0; got 0"),
        ({"lr": -0.1}, "hparam 'lr' must be a number > 0"),
        ({"lr": "0.1"}, "hparam 'lr' must be a number > 0; got '0.1'"),
        ({"lr": True}, "hparam 'lr' must be a number > 0"),
        ({"lr": float("nan")}, "hparam 'lr' must be a number > 0"),
        (
            {"lr": 0.1, "lr_scaling": "log"},
            "hparam 'lr_scaling' must be one of none, linear, sqrt",
        ),
        (
            {"lr": 0.1, "reference_batch_size": 0},
            "hparam 'reference_batch_size' must be an integer",
        ),
        ({"lr": 0.1, "reference_batch_size": 25.6}, "hparam 'reference_batch_size'"),
        ({"lr": 0.1, "momentum": 1.0}, r"hparam 'momentum' must be a number in \[0, 1\)"),
        ({"lr": 0.1, "momentum": -0.1}, "hparam 'momentum'"),
        ({"lr": 0.1, "nesterov": "yes"}, "hparam 'nesterov' must be true or false"),
        ({"lr": 0.1, "nesterov": True, "momentum": 0}, "hparam 'nesterov' needs a 'momentum'"),
        ({"lr": 0.1, "weight_decay": -1e-4}, "hparam 'weight_decay' must be a number >= 0"),
        ({"optimizer": "adam", "lr": 0.1, "betas": [0.9]}, "hparam 'betas' must be a pair"),
        ({"optimizer": "adamw", "lr": 0.1, "betas": [0.9, 1.0]}, "hparam 'betas' must be a pair"),
        ({"optimizer": "radam", "lr": 0.1, "eps": 0}, "hparam 'eps' must be a number > 0"),
        ({"optimizer": "lars", "lr": 0.1, "trust_coefficient": 0}, "hparam 'trust_coefficient'"),
    ],
)
def test_bad_hparams_raise_one_clear_line(hparams: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        build_optimizer(_model().parameters(), hparams, global_batch_size=256, world_size=1)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_sgd_does_not_import_pytorch_optimizer() -> None:
    # pytorch-optimizer costs about a second of start-up; only lars/lamb may pay it.
    code = (
        "import sys, torch\n"
        "from trials.runtime._optimizers import build_optimizer\n"
        "build_optimizer(torch.nn.Linear(2, 1).parameters(), {'optimizer': 'adamw', 'lr': 0.1},"
        " global_batch_size=8, world_size=1)\n"
        "assert 'pytorch_optimizer' not in sys.modules, 'imported eagerly'\n"
        "build_optimizer(torch.nn.Linear(2, 1).parameters(), {'optimizer': 'lamb', 'lr': 0.1},"
        " global_batch_size=8, world_size=1)\n"
        "assert 'pytorch_optimizer' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
