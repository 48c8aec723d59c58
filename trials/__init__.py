"""slotsweep's trials: the scheduler, the launcher and the in-worker runtime.

``trials`` may import ``storage``, never ``searcher`` or ``ui``. Code that runs inside
each rank keeps heavy imports (Optuna, SQLAlchemy) lazy so a trial starts fast.
"""

from trials._batching import per_slot_batch_size
from trials._config import (
    CheckpointStorageConfig,
    Length,
    OptimizationsConfig,
    ProfilingConfig,
    PrunerSpec,
    RuntimeSpec,
)

__all__ = [
    "CheckpointStorageConfig",
    "Length",
    "OptimizationsConfig",
    "ProfilingConfig",
    "PrunerSpec",
    "RuntimeSpec",
    "per_slot_batch_size",
]
