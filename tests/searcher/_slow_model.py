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
``DamagingDigitsTrial`` damages its newest checkpoints and crashes (a restart meets them).
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import torch
from model import DigitsTrial

from trials import is_url, store_for
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


class DamagingDigitsTrial(SlowDigitsTrial):
    """On its first attempt, at the first batch of epoch ``data.damage_at_epoch``, rank 0
    damages the trial's newest ``data.damage_newest`` checkpoints (``"all"``: every one)
    as a full disk, a torn write or a half-finished copy leaves them (``state.pt`` cut to
    its first 64 bytes), then dies by SIGKILL: the driver's restart meets them.

    The checkpoints are found as any reader finds them (:func:`trials.store_for`, a
    folder or a bucket), newest by the step their ``metadata.json`` records.
    """

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        context = self.context
        data = context.data
        if (
            context.attempt == 0
            and context.is_chief
            and epoch_idx == int(data.get("damage_at_epoch", -1))
        ):
            _damage_newest(context.checkpoint_dir, data.get("damage_newest", 1))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_batch(batch, epoch_idx, batch_idx)


def _damage_newest(folder: Any, how_many: int | str) -> None:
    store = store_for(folder)
    steps = {}
    for location in store.whole(str(folder)):
        with store.read(location, "metadata.json") as f:
            steps[location] = json.loads(f.read())["steps_completed"]
    newest_first = sorted(steps, key=steps.__getitem__, reverse=True)
    for location in newest_first if how_many == "all" else newest_first[: int(how_many)]:
        with store.read(location, "state.pt") as f:
            head = f.read(64)
        if is_url(location):
            store.fs.pipe_file(f"{location.split('://', 1)[1]}/state.pt", head)
        else:
            with open(os.path.join(location, "state.pt"), "wb") as f:
                f.write(head)
