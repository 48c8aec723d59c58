"""Test-only digits trials with a bottleneck put in on purpose, for ``slotsweep diagnose``.

``data.loader_delay_s``: every training sample takes this long to load (a slow input
pipeline; the validation set is not slowed). ``data.exchange_delay_s``: each DDP
bucket's all-reduce waits this long per float32 bucket before it starts, in proportion
to the bytes it sends (a slow network: an fp16-compressed bucket waits half as long).
``data.compute_delay_s``: every training batch computes (sleeps) this long beside its
real work. ``data.fail_message``: the trial's constructor raises ``ValueError`` with it,
before it builds anything (a user's model that names a layer it does not have).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from model import DigitsTrial
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import Dataset

from trials.runtime import DataLoader, PyTorchTrialContext


class _SlowSamples(Dataset[Any]):
    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.delay_s)
        return self.inner[index]


class _SlowWire:
    """``torch.distributed`` as torch's DDP hooks call it, with an all-reduce that waits
    in proportion to the bytes it sends."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay_s * tensor.element_size() / 4)
        return dist.all_reduce(tensor, *args, **kwargs)


class BottleneckDigitsTrial(DigitsTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        data = context.data
        if data.get("fail_message"):
            raise ValueError(data["fail_message"])
        super().__init__(context)
        self._loader_delay_s = float(data.get("loader_delay_s", 0.0))
        self._compute_delay_s = float(data.get("compute_delay_s", 0.0))
        exchange_delay_s = float(data.get("exchange_delay_s", 0.0))
        if exchange_delay_s and context.world_size > 1:
            # torch's hooks (the configured compression's among them) all-reduce through
            # their module's `dist`; DDP's own all-reduce runs in C++, so without a
            # compression torch's plain hook takes its place.
            default_hooks.dist = _SlowWire(exchange_delay_s)  # type: ignore[assignment]
            if context.spec.optimizations.gradient_compression == "none":
                self.model.register_comm_hook(None, default_hooks.allreduce_hook)

    def build_training_data_loader(self) -> DataLoader:
        if not self._loader_delay_s:
            return super().build_training_data_loader()
        return DataLoader(_SlowSamples(self.train_set, self._loader_delay_s), shuffle=True)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        time.sleep(self._compute_delay_s)
        return super().train_batch(batch, epoch_idx, batch_idx)
