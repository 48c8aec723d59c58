"""The in-worker runtime: what user code meets inside every rank of a trial.

Two ways to write a trial, both named by the experiment's ``entrypoint``:

- a :class:`PyTorchTrial` subclass: the platform owns the loop (sharding, DDP, gradient
  aggregation and compression, mixed precision, metric averaging, validation,
  checkpoints, pruning, timings);
- any callable taking a :class:`TrialContext`: your own loop, with the platform's
  reporting, pruning and checkpoint calls (the core API).

This package imports torch but neither Optuna nor SQLAlchemy: only rank 0 imports
those, lazily, so the other ranks start with torch's own cost.

Example:
    >>> from trials.runtime import DataLoader, PyTorchTrial, PyTorchTrialContext
    >>> from trials.runtime import build_lr_scheduler, build_optimizer
"""

from trials.runtime._context import (
    InvalidTrialError,
    LoadedCheckpoint,
    PyTorchTrialContext,
    TrialContext,
)
from trials.runtime._data import DataLoader
from trials.runtime._lr_schedule import build_lr_scheduler
from trials.runtime._optimizers import build_optimizer
from trials.runtime._trial import PyTorchTrial

__all__ = [
    "DataLoader",
    "InvalidTrialError",
    "LoadedCheckpoint",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "TrialContext",
    "build_lr_scheduler",
    "build_optimizer",
]
