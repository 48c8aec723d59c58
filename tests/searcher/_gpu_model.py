"""The trial of the GPU end-to-end search: every rank writes down where it runs.

At the start of each trial every rank writes
``<data.probe_dir>/trial-<number>-rank-<rank>.json``: the slots it was given
(``CUDA_VISIBLE_DEVICES``, ``SLOTSWEEP_SLOTS``), the CUDA devices it sees, the one it
runs on and that device's UUID, where the wrapped model's weights are and which device
DDP binds, the process group's backend, and the CUDA caching allocator's reserved and
peak bytes before the trial allocated anything. Then it frees a ``BLOCK_BYTES`` block
into the allocator's cache, where it stays until the trial ends: a warm job must hand
that memory back before its next trial, and the system-metrics sampler sees it used.
Every batch sleeps ``data.batch_sleep_s``, so the sampler takes samples while it trains.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from trials.runtime import DataLoader, PyTorchTrial, PyTorchTrialContext

BLOCK_BYTES = 2**30


def _dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(64, 8, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def _cuda_state(device: torch.device) -> dict[str, Any]:
    """What this rank's CUDA sees, before the trial allocates anything."""
    if device.type != "cuda":
        return {}
    return {
        "current_device": torch.cuda.current_device(),
        "device_count": torch.cuda.device_count(),
        "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
        "reserved_at_start": torch.cuda.memory_reserved(device),
        "peak_at_start": torch.cuda.max_memory_allocated(device),
    }


class GpuProbeTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        device = context.device
        probe: dict[str, Any] = {
            "rank": context.rank,
            "local_rank": context.local_rank,
            "world_size": context.world_size,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "slotsweep_slots": os.environ.get("SLOTSWEEP_SLOTS"),
            "device": str(device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            **_cuda_state(device),
        }
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.model = context.wrap_model(model)
        probe["parameter_devices"] = sorted({str(p.device) for p in self.model.parameters()})
        probe["ddp_device_ids"] = getattr(self.model, "device_ids", None)
        if device.type == "cuda":
            block = torch.empty(BLOCK_BYTES, dtype=torch.uint8, device=device)
            block.fill_(1)
            del block  # freed, but the caching allocator keeps it reserved
            torch.cuda.synchronize(device)
            probe["reserved_after_block"] = torch.cuda.memory_reserved(device)
        folder = Path(context.data["probe_dir"])
        name = f"trial-{context.spec.optuna_trial_number}-rank-{context.rank}.json"
        (folder / name).write_text(json.dumps(probe))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        self.data = _dataset()
        self.sleep_s = float(context.data.get("batch_sleep_s", 0.0))

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.data, shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=32)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        time.sleep(self.sleep_s)
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
