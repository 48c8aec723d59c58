"""The trial of the GPU share search: each trial writes down its share of the GPU.

At its start each trial (one rank) writes ``<data.probe_dir>/trial-<number>.json``: the
GPU it sees (``CUDA_VISIBLE_DEVICES``, the device's UUID), its share
(``SLOTSWEEP_SLOT_SHARE``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), the memory fraction
torch was told (where torch can say), and whether an allocation of a little more than
its share of the GPU's memory fails while one of a little less succeeds: the cap in
force. It then waits, up to ``data.wait_s``, until ``data.together`` trials have
written theirs, so they are seen running on the GPU at once, and trains a few batches.

A trial whose number is in ``data.greedy_trials`` allocates ``data.greedy_fraction`` of
the GPU in one block instead: past its cap, it fails with the cap's one line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trials.runtime import DataLoader, PyTorchTrial, PyTorchTrialContext

# Allocations this far past (and short of) the share tell whether the cap is in force.
_MARGIN = 0.05


def _allocates(device: torch.device, size: int) -> bool:
    try:
        block = torch.empty(size, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        return False
    del block
    torch.cuda.empty_cache()
    return True


class GpuShareTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        device = context.device
        data = context.data
        number = context.spec.optuna_trial_number
        total = torch.cuda.get_device_properties(device).total_memory
        share = float(os.environ.get("SLOTSWEEP_SLOT_SHARE", "1"))
        if number in data.get("greedy_trials", ()):
            block = torch.empty(
                int(total * float(data["greedy_fraction"])), dtype=torch.uint8, device=device
            )
            del block
        fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        probe: dict[str, Any] = {
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "slotsweep_slots": os.environ.get("SLOTSWEEP_SLOTS"),
            "share": os.environ.get("SLOTSWEEP_SLOT_SHARE"),
            "mps_threads": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            "device_count": torch.cuda.device_count(),
            "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
            "memory_fraction": None if fraction is None else fraction(device),
            "over_share_allocates": _allocates(device, int(total * (share + _MARGIN))),
            "under_share_allocates": _allocates(device, int(total * (share - _MARGIN))),
        }
        folder = Path(data["probe_dir"])
        (folder / f"trial-{number}.json").write_text(json.dumps(probe))
        deadline = time.monotonic() + float(data.get("wait_s", 60))
        together = int(data.get("together", 1))
        while len(list(folder.glob("trial-*.json"))) < together and time.monotonic() < deadline:
            time.sleep(0.1)
        self.model = context.wrap_model(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        )
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        generator = torch.Generator().manual_seed(3)
        x = torch.randn(64, 8, generator=generator)
        self.data = TensorDataset(x, x.sum(dim=1, keepdim=True))

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.data, shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=32)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
