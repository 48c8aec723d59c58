"""Optimizers of the large-batch recipe, chosen and scaled by hyperparameters.

A trial names its optimizer and base learning rate in its hparams; this module turns
them into a ``torch.optim.Optimizer`` whose learning rate is already scaled to the
trial's global batch size. Scaling follows Goyal et al. ("Accurate, Large Minibatch
SGD": lr x global_batch / 256), its square-root variant for adaptive optimizers, or
Horovod's convention (lr x world size).

LARS and LAMB come from the pytorch-optimizer package, imported only when chosen
because importing it costs about a second of every trial's start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch.optim.optimizer import ParamsT

OPTIMIZERS = ("sgd", "adam", "adamw", "radam", "lars", "lamb")
LR_SCALINGS = ("none", "linear", "sqrt", "world_size")
DEFAULT_REFERENCE_BATCH_SIZE = 256
# SGD-style optimizers default to the momentum of the large-batch recipe.
DEFAULT_MOMENTUM = 0.9


def scaled_lr(
    base_lr: float,
    lr_scaling: str,
    *,
    global_batch_size: int,
    reference_batch_size: int = DEFAULT_REFERENCE_BATCH_SIZE,
    world_size: int = 1,
) -> float:
    """The learning rate for ``global_batch_size``, scaled from ``base_lr``.

    ``none`` keeps ``base_lr``; ``linear`` multiplies it by
    ``global_batch_size / reference_batch_size`` (Goyal et al.); ``sqrt`` by the square
    root of that ratio; ``world_size`` by the number of ranks (Horovod's convention).

    Example:
        >>> scaled_lr(0.1, "linear", global_batch_size=1024)
        0.4
        >>> scaled_lr(0.1, "world_size", global_batch_size=1024, world_size=8)
        0.8
    """
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(f"lr_scaling must be one of {', '.join(LR_SCALINGS)}; got {lr_scaling!r}")
    for name, value in (
        ("global_batch_size", global_batch_size),
        ("reference_batch_size", reference_batch_size),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    ratio = global_batch_size / reference_batch_size
    if lr_scaling == "linear":
        return base_lr * ratio
    if lr_scaling == "sqrt":
        return base_lr * math.sqrt(ratio)
    if lr_scaling == "world_size":
        return base_lr * world_size
    return base_lr


def build_optimizer(
    params: ParamsT,
    hparams: Mapping[str, Any],
    *,
    global_batch_size: int,
    world_size: int,
) -> torch.optim.Optimizer:
    """The optimizer that ``hparams`` name, with its learning rate scaled.

    Keys read from ``hparams`` (others are ignored, so one hparams dict can carry the
    model's settings too; a key that does not apply to the chosen optimizer, such as
    ``momentum`` for adam, is ignored as well, which lets a search space share it):

    - ``optimizer``: sgd (default), adam, adamw, radam, lars or lamb.
    - ``lr`` (required): the base learning rate, see :func:`scaled_lr`.
    - ``lr_scaling``: none (default), linear, sqrt or world_size.
    - ``reference_batch_size``: the batch size ``lr`` was tuned for (256).
    - ``momentum`` (sgd, lars; 0.9) and ``nesterov`` (sgd, lars; false).
    - ``weight_decay`` (0).
    - ``betas`` and ``eps`` (adam, adamw, radam, lamb; the optimizer's defaults).
    - ``trust_coefficient`` (lars; pytorch-optimizer's default 0.001).

    Raises:
        ValueError: one line naming the bad hparam and what is allowed.

    Example:
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = build_optimizer(
        ...     model.parameters(),
        ...     {"optimizer": "sgd", "lr": 0.1, "lr_scaling": "linear"},
        ...     global_batch_size=512,
        ...     world_size=2,
        ... )
        >>> opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]
        (0.2, 0.9)
    """
    name = hparams.get("optimizer", "sgd")
    if name not in OPTIMIZERS:
        raise ValueError(
            f"hparam 'optimizer' must be one of {', '.join(OPTIMIZERS)}; got {name!r}"
        )
    lr = _scaled_lr_of(hparams, global_batch_size=global_batch_size, world_size=world_size)
    weight_decay = _number(hparams, "weight_decay", 0.0, low=0.0)
    if name in ("sgd", "lars"):
        return _momentum_optimizer(name, params, hparams, lr=lr, weight_decay=weight_decay)
    return _adaptive_optimizer(name, params, hparams, lr=lr, weight_decay=weight_decay)


def _scaled_lr_of(hparams: Mapping[str, Any], *, global_batch_size: int, world_size: int) -> float:
    """The learning rate ``hparams`` ask for (``lr``, ``lr_scaling``, ``reference_batch_size``)."""
    if "lr" not in hparams:
        raise ValueError("hparam 'lr' is required (a positive number, the base learning rate)")
    base_lr = _number(hparams, "lr", low=0.0, low_open=True)
    lr_scaling = hparams.get("lr_scaling", "none")
    if lr_scaling not in LR_SCALINGS:
        raise ValueError(
            f"hparam 'lr_scaling' must be one of {', '.join(LR_SCALINGS)}; got {lr_scaling!r}"
        )
    reference_batch_size = _integer(
        hparams, "reference_batch_size", DEFAULT_REFERENCE_BATCH_SIZE, low=1
    )
    return scaled_lr(
        base_lr,
        lr_scaling,
        global_batch_size=global_batch_size,
        reference_batch_size=reference_batch_size,
        world_size=world_size,
    )


def _momentum_optimizer(
    name: str, params: ParamsT, hparams: Mapping[str, Any], *, lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """SGD or LARS, with ``momentum``, ``nesterov`` (and LARS's ``trust_coefficient``)."""
    momentum = _number(hparams, "momentum", DEFAULT_MOMENTUM, low=0.0, high=1.0, high_open=True)
    nesterov = hparams.get("nesterov", False)
    if not isinstance(nesterov, bool):
        raise ValueError(f"hparam 'nesterov' must be true or false; got {nesterov!r}")
    if nesterov and momentum == 0.0:
        raise ValueError("hparam 'nesterov' needs a 'momentum' above 0 (got momentum 0)")
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
        )
    from pytorch_optimizer import LARS  # lazy: costs ~1 s to import

    lars_kwargs: dict[str, Any] = {}
    if "trust_coefficient" in hparams:
        lars_kwargs["trust_coefficient"] = _number(
            hparams, "trust_coefficient", low=0.0, low_open=True
        )
    return LARS(
        params,
        lr=lr,
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
        **lars_kwargs,
    )


def _adaptive_optimizer(
    name: str, params: ParamsT, hparams: Mapping[str, Any], *, lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """Adam, AdamW, RAdam or LAMB, with ``betas`` and ``eps`` when given."""
    adam_kwargs: dict[str, Any] = {}
    if "betas" in hparams:
        adam_kwargs["betas"] = _betas(hparams["betas"])
    if "eps" in hparams:
        adam_kwargs["eps"] = _number(hparams, "eps", low=0.0, low_open=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **adam_kwargs)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adam_kwargs)
    if name == "radam":
        return torch.optim.RAdam(params, lr=lr, weight_decay=weight_decay, **adam_kwargs)
    from pytorch_optimizer import Lamb  # lazy: costs ~1 s to import

    return Lamb(params, lr=lr, weight_decay=weight_decay, **adam_kwargs)


def _number(
    hparams: Mapping[str, Any],
    key: str,
    default: float | None = None,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``hparams[key]`` (or ``default``) as a float within the given bounds, else ValueError.

    YAML and Optuna give ints for round values (``lr: 1``), so ints count as numbers;
    bools do not.
    """
    value = hparams.get(key, default)
    if low is not None and high is not None:
        allowed = (
            f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        )
    elif low is not None:
        allowed = f"a number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        allowed = f"a number {'<' if high_open else '<='} {high:g}"
    else:
        allowed = "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"hparam {key!r} must be {allowed}; got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"hparam {key!r} must be {allowed}; got {value!r}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"hparam {key!r} must be {allowed}; got {value!r}")
    return float(value)


def _integer(hparams: Mapping[str, Any], key: str, default: int, *, low: int) -> int:
    """``hparams[key]`` (or ``default``) as an int >= ``low``, else ValueError."""
    value = hparams.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"hparam {key!r} must be an integer >= {low}; got {value!r}")
    return value


def _betas(value: Any) -> tuple[float, float]:
    message = (
        f"hparam 'betas' must be a pair of numbers in [0, 1), such as [0.9, 0.999]; got {value!r}"
    )
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(message)
    betas = []
    for beta in value:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta < 1.0:
            raise ValueError(message)
        betas.append(float(beta))
    return betas[0], betas[1]
