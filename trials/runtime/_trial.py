"""The trial interface of the managed loop, in the spirit of Determined's PyTorchTrial.

User code builds the model, optimizer, scheduler and data, and says what one training
and one evaluation batch do; the platform owns the loop around them: sharding, DDP,
gradient aggregation, mixed precision, metric averaging, validation, checkpoints,
pruning and timing.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

from trials.runtime._context import PyTorchTrialContext
from trials.runtime._data import DataLoader


class PyTorchTrial(abc.ABC):
    """Subclass this and name it as the experiment's ``entrypoint`` (``model:MyTrial``).

    - ``__init__(context)`` builds everything through the context:
      ``context.wrap_model``, ``context.wrap_optimizer``, ``context.wrap_lr_scheduler``.
    - ``build_training_data_loader`` / ``build_validation_data_loader`` return a
      :class:`~trials.runtime.DataLoader` over a map-style data set (the platform adds
      the distributed sampler; batch size defaults to ``context.per_slot_batch_size``).
    - ``train_batch(batch, epoch_idx, batch_idx)`` runs forward, ``context.backward(loss)``
      and ``context.step_optimizer(opt)``, and returns scalar metrics; ``batch_idx``
      counts batches across epochs.
    - ``evaluate_batch(batch, batch_idx)`` returns scalar metrics of one validation
      batch; the platform weights them by the batch's samples and averages over the
      whole validation set and every rank.

    Training metrics are averaged over the batches since the last report and recorded
    at least every ``scheduling_unit`` batches, at every epoch end, validation and
    checkpoint. Return the same metric names on every rank: they travel in one
    all-reduce.

    Example:
        >>> class DigitsTrial(PyTorchTrial):  # see examples/digits/model.py
        ...     def train_batch(self, batch, epoch_idx, batch_idx):
        ...         x, y = batch
        ...         loss = torch.nn.functional.cross_entropy(self.model(x), y)
        ...         self.context.backward(loss)
        ...         self.context.step_optimizer(self.optimizer)
        ...         return {"loss": loss}
    """

    #: Record training metrics at least every this many batches (Determined's default).
    scheduling_unit: ClassVar[int] = 100

    def __init__(self, context: PyTorchTrialContext) -> None:
        self.context = context

    @abc.abstractmethod
    def build_training_data_loader(self) -> DataLoader:
        """The training data; shuffled per epoch when ``shuffle=True``."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> DataLoader:
        """The validation data; every sample is evaluated exactly once per validation."""

    @abc.abstractmethod
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Mapping[str, Any]:
        """Train on one batch (already on the device); return scalar metrics."""

    @abc.abstractmethod
    def evaluate_batch(self, batch: Any, batch_idx: int) -> Mapping[str, Any]:
        """Evaluate one batch (no gradients, models in eval mode); return scalar metrics."""
