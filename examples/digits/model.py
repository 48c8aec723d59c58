"""A small MLP on scikit-learn's bundled 8x8 digits (1797 images, no download).

The large-batch recipe comes from the hyperparameters through the runtime's helpers:
``optimizer``, ``lr`` scaled by ``lr_scaling`` relative to ``reference_batch_size``,
``warmup_epochs`` then ``lr_decay``. An epoch takes well under a second on one CPU core.

Hyperparameters read here: ``global_batch_size`` (required), ``hidden_size`` (64),
``dropout`` (0.0) and those of :func:`trials.runtime.build_optimizer` and
:func:`trials.runtime.build_lr_scheduler`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trials.runtime import (
    DataLoader,
    PyTorchTrial,
    PyTorchTrialContext,
    build_lr_scheduler,
    build_optimizer,
)

VALIDATION_FRACTION = 0.2
# The split is fixed across trials, so their validation losses compare.
SPLIT_SEED = 0


def _digits_csv() -> Path:
    """The CSV that scikit-learn ships, found without importing scikit-learn.

    ``sklearn.datasets.load_digits`` reads this same file, but importing scikit-learn
    takes about a second of CPU, paid again by every rank of every cold trial.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the digits example reads scikit-learn's data: pip install scikit-learn"
        )
    return (
        Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    )


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    """Training and validation sets: pixels scaled to [0, 1], a fixed 80/20 split."""
    # One row per image: 64 pixel intensities (0-16), then the digit.
    table = np.loadtxt(_digits_csv(), delimiter=",")
    x = torch.tensor(table[:, :-1], dtype=torch.float32) / 16.0
    y = torch.tensor(table[:, -1], dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = int(len(x) * VALIDATION_FRACTION)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


class DigitsTrial(PyTorchTrial):
    """Classify 8x8 digits with a two-layer MLP; reports ``val_loss`` and ``val_accuracy``."""

    def __init__(self, context: PyTorchTrialContext) -> None:
        super().__init__(context)
        hparams = context.hparams
        # Kept in the worker's cache: with warm workers (resources.reuse_workers) the
        # next trial on these ranks finds it loaded. The tensors are only read.
        if "digits" not in context.cache:
            context.cache["digits"] = digits_datasets()
        self.train_set, self.val_set = context.cache["digits"]
        hidden = int(hparams.get("hidden_size", 64))
        model = nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Dropout(float(hparams.get("dropout", 0.0))),
            nn.Linear(hidden, 10),
        )
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(
            build_optimizer(
                self.model.parameters(),
                hparams,
                global_batch_size=context.global_batch_size,
                world_size=context.world_size,
            )
        )
        self.scheduler = context.wrap_lr_scheduler(
            build_lr_scheduler(
                self.optimizer,
                hparams,
                steps_per_epoch=context.optimizer_steps_per_epoch(len(self.train_set)),
                total_steps=context.total_optimizer_steps(len(self.train_set)),
            )
        )
        self.loss_fn = nn.CrossEntropyLoss()

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(self.train_set, shuffle=True)

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "lr": self.optimizer.param_groups[0]["lr"]}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        logits = self.model(x)
        return {
            "val_loss": self.loss_fn(logits, y),
            "val_accuracy": (logits.argmax(dim=1) == y).float().mean(),
        }
