"""slotsweep's trials: scheduling, launching and running trials, and what drivers share.

Its sub-packages, each building only on those before it: :mod:`trials.scheduler`
(the pure scheduler core), :mod:`trials.launch` (command lines, the environment the
ranks read, process identity), :mod:`trials.pruning` (the multi-objective pruners and
their Pareto ranking), :mod:`trials.runtime` (inside every rank),
:mod:`trials.node` (the programs on each node), :mod:`trials.executors` (where attempts
run), :mod:`trials.coordination` (what drivers share in the database) and
:mod:`trials.queries` (the read model: what the CLI, the API and the UI ask of the
database; nothing else in ``trials`` imports it). The modules
at this level (the experiment config, YAML and validation helpers, timings, labels,
checkpoint storage and retention, a trial's compute spent, its entrypoint's resolution,
GPU detection) import none of them; every sub-package may.

``trials`` may import ``storage``, never ``searcher`` or ``ui``. Code that runs inside
each rank keeps heavy imports (Optuna, SQLAlchemy) lazy so a trial starts fast.
"""

from trials.checkpoint_storage import (
    CheckpointCorruptedError,
    CheckpointMissingError,
    CheckpointStorageError,
    checkpoint_root,
    storage_environment,
    store_for,
    trial_checkpoint_dir,
)
from trials.compute_spent import RunSpan, slot_seconds_spent
from trials.config import (
    CheckpointStorageConfig,
    Length,
    OptimizationsConfig,
    ProfilingConfig,
    PrunerSpec,
    RuntimeSpec,
    is_url,
    per_slot_batch_size,
)
from trials.retention import CheckpointRecord, checkpoints_to_delete, collect_garbage

__all__ = [
    "CheckpointCorruptedError",
    "CheckpointMissingError",
    "CheckpointRecord",
    "CheckpointStorageConfig",
    "CheckpointStorageError",
    "Length",
    "OptimizationsConfig",
    "ProfilingConfig",
    "PrunerSpec",
    "RunSpan",
    "RuntimeSpec",
    "checkpoint_root",
    "checkpoints_to_delete",
    "collect_garbage",
    "is_url",
    "per_slot_batch_size",
    "slot_seconds_spent",
    "storage_environment",
    "store_for",
    "trial_checkpoint_dir",
]
