"""The in-worker runtime: what user code meets inside every rank of a trial.

Two ways to write a trial, both named by the experiment's ``entrypoint``:

- a :class:`PyTorchTrial` subclass: the platform owns the loop (sharding, DDP, gradient
  aggregation and compression, mixed precision, metric averaging, validation,
  checkpoints, pruning, timings);
- any callable taking a :class:`TrialContext`: your own loop, with the platform's
  reporting, pruning and checkpoint calls (the core API).

This package imports torch but neither Optuna nor SQLAlchemy: only rank 0 imports
those, lazily, so the other ranks start with torch's own cost.

Besides the trial API it exports what the rank's program (:mod:`trials.node.worker`)
and the ``torchrun`` wrapper run: a trial, a warm job's loop, the failure record.
May import ``storage`` (rank 0, lazily), the base modules of ``trials``,
:mod:`trials.launch` (the environment the driver sets) and :mod:`trials.pruning` (rank
0's reports to the study's pruner); only :mod:`trials.node`
imports it, so the driver's side never loads torch.

Example:
    >>> from trials.runtime import DataLoader, PyTorchTrial, PyTorchTrialContext
    >>> from trials.runtime import build_lr_scheduler, build_optimizer
"""

from trials.entrypoints import InvalidTrialError, load_entrypoint
from trials.runtime._accelerator import Accelerator, CpuAccelerator, accelerator_for
from trials.runtime._checkpoint import CheckpointMismatchError, read_checkpoint
from trials.runtime._context import (
    LoadedCheckpoint,
    PyTorchTrialContext,
    TrialContext,
)
from trials.runtime._data import DataLoader
from trials.runtime._distributed import DistributedInfo, barrier, destroy_process_group
from trials.runtime._failure import record_failure
from trials.runtime._isolation import TorchGlobals, reset_between_trials
from trials.runtime._lr_schedule import build_lr_scheduler
from trials.runtime._optimizers import build_optimizer
from trials.runtime._runner import join_job, preload_entrypoint, run_trial
from trials.runtime._signals import install_checkpoint_on_sigterm
from trials.runtime._trial import PyTorchTrial
from trials.runtime._warm import WarmChannel

__all__ = [
    "Accelerator",
    "CheckpointMismatchError",
    "CpuAccelerator",
    "DataLoader",
    "DistributedInfo",
    "InvalidTrialError",
    "LoadedCheckpoint",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "TorchGlobals",
    "TrialContext",
    "WarmChannel",
    "accelerator_for",
    "barrier",
    "build_lr_scheduler",
    "build_optimizer",
    "destroy_process_group",
    "install_checkpoint_on_sigterm",
    "join_job",
    "load_entrypoint",
    "preload_entrypoint",
    "read_checkpoint",
    "record_failure",
    "reset_between_trials",
    "run_trial",
]
