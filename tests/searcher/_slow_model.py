"""A test-only digits trial that runs slowly enough to be interrupted on purpose.

``data.batch_delay_s`` sleeps in every training batch (of attempts before
``data.fast_from_attempt`` only, if that is set); ``data.gate_file`` holds a trial at
its start, with its slots, until that file exists (a test opens the gate once it has set
the scene). Both apply to the trials whose Optuna numbers ``data.slow_trials`` lists
only, if that is set: a test holds or slows the trials it interrupts and lets the others
train at full speed.
``data.fsync_delay_s`` slows
``os.fsync`` in the trial's processes, which holds a checkpoint mid-write long enough
for a test to crash the machine at that moment (fault injection, test code only).
``DivergingDigitsTrial`` reports the infinite and NaN losses of a diverged run;
``DearAndWorseDigitsTrial`` makes chosen trials learn nothing and sleep in every batch,
so on a front of quality against compute they are dominated;
``HangingDigitsTrial`` hangs one rank of one attempt of a trial (a stuck data loader or
a deadlock), which only the driver's ``hang_timeout_s`` can end.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from model import DigitsTrial

from trials.runtime import PyTorchTrialContext


class SlowDigitsTrial(DigitsTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        data = context.data
        slow_trials = data.get("slow_trials")
        chosen = slow_trials is None or context.spec.optuna_trial_number in slow_trials
        fast_from = data.get("fast_from_attempt")
        slow = chosen and (fast_from is None or context.attempt < int(fast_from))
        self._batch_delay_s = float(data.get("batch_delay_s", 0.0)) if slow else 0.0
        gate = data.get("gate_file") if chosen else None
        while gate is not None and not os.path.exists(gate):
            time.sleep(0.05)
        fsync_delay_s = float(context.data.get("fsync_delay_s", 0.0))
        if fsync_delay_s:
            real_fsync = os.fsync

            def slow_fsync(fd: int) -> None:
                time.sleep(fsync_delay_s)
                real_fsync(fd)

            os.fsync = slow_fsync

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        time.sleep(self._batch_delay_s)
        return super().train_batch(batch, epoch_idx, batch_idx)


class DivergingDigitsTrial(DigitsTrial):
    """A trial whose training diverged: every loss is infinite and ``val_loss`` is NaN."""

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        metrics = super().train_batch(batch, epoch_idx, batch_idx)
        return {**metrics, "loss": metrics["loss"].detach() * float("inf")}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        metrics = super().evaluate_batch(batch, batch_idx)
        return {**metrics, "val_loss": metrics["val_loss"] * float("nan")}


class DearAndWorseDigitsTrial(SlowDigitsTrial):
    """The trials whose Optuna numbers ``data.dear_trials`` lists train on shuffled labels
    (they learn nothing) and sleep ``data.dear_batch_delay_s`` in every training batch:
    worse and more expensive than every other trial at every step, whatever the sampler
    draws. The others train as :class:`SlowDigitsTrial` does."""

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        data = context.data
        self._dear = context.spec.optuna_trial_number in data.get("dear_trials", [])
        if self._dear:
            self._batch_delay_s = float(data.get("dear_batch_delay_s", 0.01))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if self._dear:
            x, y = batch
            batch = (x, y[torch.randperm(len(y))])
        return super().train_batch(batch, epoch_idx, batch_idx)


class HangingDigitsTrial(SlowDigitsTrial):
    """Rank ``data.hang_rank`` (default 1) of attempt ``data.hang_attempt`` (default 0)
    sleeps forever at training batch ``data.hang_at_batch`` (default 5) of its process;
    every other attempt trains normally.

    The other ranks then wait in the next all-reduce, so rank 0 records nothing more and
    the run makes no progress, exactly as a real hang looks to the driver.
    """

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        data = context.data
        hangs = context.attempt == int(data.get("hang_attempt", 0)) and context.rank == int(
            data.get("hang_rank", 1)
        )
        self._hang_at = int(data.get("hang_at_batch", 5)) if hangs else None
        self._batches = 0

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if self._batches == self._hang_at:
            while True:
                time.sleep(3600)
        self._batches += 1
        return super().train_batch(batch, epoch_idx, batch_idx)
