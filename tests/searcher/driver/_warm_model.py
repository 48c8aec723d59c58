"""Trials for the warm-worker tests: one that changes what it should not, one that fails.

``MutatingTrial`` regresses a seeded random target with a small MLP. When the
hyperparameter ``mutate_first`` is true, trial number 0 of its search leaves behind
everything a careless trial changes in its process: torch's default dtype, thread
count, deterministic algorithms, anomaly detection and CPU autocast (with a bfloat16
dtype, which changes every matmul), the RNGs, and a module global that the data
depends on. A warm job that failed to isolate the next trial would give it other
metrics than a cold start.

Every trial records in the worker's ``context.cache`` that it ran, and prints how
many trials the cache saw before it: the one place state crosses trials on purpose.

``data.fail_trial`` (a trial number) makes that trial raise after its first epoch;
``data.batch_delay_s`` slows every batch down (a trial long enough to interrupt): of the
trials whose numbers ``data.slow_trials`` lists only, and of attempts before
``data.fast_from_attempt`` only, where those are set.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from trials.runtime import DataLoader, PyTorchTrial, PyTorchTrialContext

# Added to every input: a trial that leaves it changed changes the next trial's data
# unless the module is imported afresh.
SHIFT = {"value": 0.0}

# Each import says so: a warm job imports the module again ahead of its next trial, and
# what it prints then belongs in that trial's log.
print("warm_model imported", flush=True)


def _dataset(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 8, generator=generator, dtype=torch.float32)
    weights = torch.linspace(-1.0, 1.0, 8, dtype=torch.float32)
    noise = torch.randn(256, 1, generator=generator, dtype=torch.float32)
    y = (x * weights).sum(dim=1, keepdim=True) + 0.1 * noise
    return TensorDataset(x + SHIFT["value"], y)


class MutatingTrial(PyTorchTrial):
    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        number = context.spec.optuna_trial_number
        seen = context.cache.setdefault("trials_seen", [])
        print(f"cache saw trials {list(seen)} before trial {number}", flush=True)
        seen.append(number)
        self.fail = context.spec.data.get("fail_trial") == number
        data = context.spec.data
        slow_trials = data.get("slow_trials")
        fast_from = data.get("fast_from_attempt")
        slow = (slow_trials is None or number in slow_trials) and (
            fast_from is None or context.attempt < int(fast_from)
        )
        self.delay_s = float(data.get("batch_delay_s", 0.0)) if slow else 0.0
        if context.get_hparam("mutate_first") and number == 0:
            _mutate_process()
        # Built after any mutation, as a careless trial's next neighbour would be.
        self.data = _dataset(seed=7)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))
        self.loss_fn = nn.MSELoss()

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.data, shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=64)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if self.fail and epoch_idx >= 1:
            raise RuntimeError("this trial fails on purpose")
        time.sleep(self.delay_s)
        x, y = batch
        dtype = torch.get_default_dtype()
        loss = self.loss_fn(self.model(x.to(dtype)).to(dtype), y.to(dtype))
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        # A random draw per batch: the RNGs must start each trial from its seed.
        noise = torch.rand(1).item()
        return {"loss": loss, "noise": noise}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        dtype = torch.get_default_dtype()
        return {"val_loss": self.loss_fn(self.model(x.to(dtype)).to(dtype), y.to(dtype))}


def _mutate_process() -> None:
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1 + torch.get_num_threads())
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_anomaly_enabled(True)
    torch.set_autocast_enabled("cpu", True)
    torch.set_autocast_dtype("cpu", torch.bfloat16)
    torch.manual_seed(12345)
    SHIFT["value"] = 3.0
