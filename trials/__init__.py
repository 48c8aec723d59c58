"""slotsweep's trials: the scheduler, the launcher and the in-worker runtime.

``trials`` may import ``storage``, never ``searcher`` or ``ui``. Code that runs inside
each rank keeps heavy imports (Optuna, SQLAlchemy) lazy so a trial starts fast.
"""

from trials.config import (
    CheckpointStorageConfig,
    Length,
    OptimizationsConfig,
    ProfilingConfig,
    PrunerSpec,
    RuntimeSpec,
    per_slot_batch_size,
)
from trials.retention import CheckpointRecord, checkpoints_to_delete, collect_garbage

__all__ = [
    "CheckpointRecord",
    "CheckpointStorageConfig",
    "Length",
    "OptimizationsConfig",
    "ProfilingConfig",
    "PrunerSpec",
    "RuntimeSpec",
    "checkpoints_to_delete",
    "collect_garbage",
    "per_slot_batch_size",
]
