"""Learning-rate warmup and decay of the large-batch recipe, from torch's schedulers.

Large global batches need their scaled learning rate reached gradually (Goyal et al.
warm up linearly over the first epochs), then decayed. The schedule is composed of
torch's own ``lr_scheduler`` classes, so its ``state_dict`` is torch's and a
checkpoint restores it exactly.

The scheduler is stepped once per optimizer step (not per batch: with
``aggregation_frequency`` k, k batches make one step), so ``steps_per_epoch`` and
``total_steps`` count optimizer steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    LinearLR,
    LRScheduler,
    SequentialLR,
    StepLR,
)

from trials.runtime._optimizers import _integer, _number

LR_DECAYS = ("constant", "cosine", "step")
DEFAULT_WARMUP_START_FACTOR = 0.1
DEFAULT_LR_STEP_GAMMA = 0.1


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    hparams: Mapping[str, Any],
    *,
    steps_per_epoch: int,
    total_steps: int,
) -> LRScheduler:
    """Warmup then decay, as ``hparams`` describe; call ``step()`` after each optimizer step.

    Keys read from ``hparams`` (others are ignored):

    - ``warmup_epochs`` (a number; fractions allowed) or ``warmup_steps`` (an integer),
      at most one of them; default no warmup. During warmup the rate rises linearly from
      ``warmup_start_factor`` (0.1, in (0, 1]) times each group's rate to that rate.
    - ``lr_decay``: after warmup, ``constant`` (default), ``cosine`` (annealed to
      ``lr_min_factor`` times the rate at ``total_steps``; default 0) or ``step``
      (multiplied by ``lr_step_gamma``, default 0.1, every ``lr_step_epochs`` epochs
      counted from the end of warmup; ``lr_step_epochs`` is required).

    The rate at step t (the number of ``step()`` calls so far), for rate ``lr``, warmup
    ``W`` steps and start factor ``s``: ``lr * (s + (1 - s) * t / W)`` while t < W; then
    ``lr`` (constant), ``lr_min + (lr - lr_min) * (1 + cos(pi * (t - W) / (total_steps - W))) / 2``
    (cosine) or ``lr * gamma ** ((t - W) // (lr_step_epochs * steps_per_epoch))`` (step).

    To restore from a checkpoint, build the optimizer and this scheduler as at the
    start, then load the optimizer's state and then the scheduler's.

    Raises:
        ValueError: one line naming the bad hparam or argument and what is allowed.

    Example:
        >>> model = torch.nn.Linear(4, 2)
        >>> opt = torch.optim.SGD(model.parameters(), lr=1.0)
        >>> sched = build_lr_scheduler(
        ...     opt, {"warmup_steps": 4, "lr_decay": "cosine"}, steps_per_epoch=10, total_steps=20
        ... )
        >>> opt.param_groups[0]["lr"]
        0.1
        >>> for _ in range(4):
        ...     opt.step()
        ...     sched.step()
        >>> opt.param_groups[0]["lr"]
        1.0
    """
    for name, value, minimum in (
        ("steps_per_epoch", steps_per_epoch, 1),
        ("total_steps", total_steps, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")

    warmup_steps = _warmup_steps(hparams, steps_per_epoch)
    start_factor = _number(
        hparams,
        "warmup_start_factor",
        DEFAULT_WARMUP_START_FACTOR,
        low=0.0,
        high=1.0,
        low_open=True,
    )
    decay = hparams.get("lr_decay", "constant")
    if decay not in LR_DECAYS:
        raise ValueError(f"hparam 'lr_decay' must be one of {', '.join(LR_DECAYS)}; got {decay!r}")

    after_warmup = _decay_scheduler(
        optimizer,
        hparams,
        decay,
        steps_per_epoch=steps_per_epoch,
        decay_steps=total_steps - warmup_steps,
    )
    if warmup_steps == 0:
        return after_warmup
    warmup = LinearLR(
        optimizer, start_factor=start_factor, end_factor=1.0, total_iters=warmup_steps
    )
    return SequentialLR(optimizer, schedulers=[warmup, after_warmup], milestones=[warmup_steps])


def _decay_scheduler(
    optimizer: torch.optim.Optimizer,
    hparams: Mapping[str, Any],
    decay: str,
    *,
    steps_per_epoch: int,
    decay_steps: int,
) -> LRScheduler:
    if decay == "cosine":
        min_factor = _number(hparams, "lr_min_factor", 0.0, low=0.0, high=1.0)
        lrs = {group["lr"] for group in optimizer.param_groups}
        # CosineAnnealingLR takes one absolute floor for every group; it is only the
        # right floor for all of them when they share one rate.
        if min_factor > 0.0 and len(lrs) > 1:
            raise ValueError(
                "hparam 'lr_min_factor' above 0 needs every param group to share one lr; "
                "use lr_min_factor 0 with per-group rates"
            )
        eta_min = min_factor * next(iter(lrs))
        # Past warmup fewer than one step may remain; T_max must stay positive.
        return CosineAnnealingLR(optimizer, T_max=max(1, decay_steps), eta_min=eta_min)
    if decay == "step":
        if "lr_step_epochs" not in hparams:
            raise ValueError(
                "hparam 'lr_step_epochs' is required when lr_decay is 'step' (a number of epochs > 0)"
            )
        step_epochs = _number(hparams, "lr_step_epochs", low=0.0, low_open=True)
        gamma = _number(
            hparams, "lr_step_gamma", DEFAULT_LR_STEP_GAMMA, low=0.0, high=1.0, low_open=True
        )
        step_size = max(1, round(step_epochs * steps_per_epoch))
        return StepLR(optimizer, step_size=step_size, gamma=gamma)
    # A factor of 1 for zero iterations: the rate stays what warmup (or the optimizer) set.
    return ConstantLR(optimizer, factor=1.0, total_iters=0)


def _warmup_steps(hparams: Mapping[str, Any], steps_per_epoch: int) -> int:
    if "warmup_epochs" in hparams and "warmup_steps" in hparams:
        raise ValueError("give at most one of hparams 'warmup_epochs' and 'warmup_steps'")
    if "warmup_steps" in hparams:
        return _integer(hparams, "warmup_steps", 0, low=0)
    return round(_number(hparams, "warmup_epochs", 0.0, low=0.0) * steps_per_epoch)
