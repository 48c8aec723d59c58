"""The experiment config, typed: parsed once from YAML or from the database, read everywhere.

Owns every model of the experiment config (:class:`ExperimentConfig` and its sections,
the hyperparameter kinds, the rank's :class:`RuntimeSpec`) with the one copy of each
default, the reader of a stored config (:func:`read_stored_config`, for the driver, the
queue, the CLI and the UI), the bounded YAML reader and the one-line pydantic error
format every slotsweep file shares, and the batch-size split of driver and ranks.

It lives in ``trials``, the lowest package every reader (``searcher``, ``trials``,
``ui``) may import. May import: pydantic and PyYAML only (and fsspec, on first use, to check a
checkpoint URL's protocol); no other slotsweep package
or sub-package, no Optuna, no SQLAlchemy. Ranks import :class:`RuntimeSpec` from here
at start-up, so the experiment model, the stored-config reader and the YAML reader
load on first use (as ``searcher``'s names do), not with it.

Example:
    >>> from trials.config import Length, read_stored_config
    >>> Length(epochs=3).unit
    'epochs'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trials.config._batching import per_slot_batch_size
from trials.config._integrations import (
    NOTIFICATION_EVENTS,
    IntegrationsConfig,
    MlflowConfig,
    NotificationConfig,
    NotificationEvent,
)
from trials.config._sections import (
    STEPS_PER_SLOT_SECOND,
    CheckpointStorageConfig,
    Length,
    MaxLength,
    OptimizationsConfig,
    ProfilingConfig,
    PrunerSpec,
    RuntimeSpec,
    WarmSpec,
    slot_seconds_step,
)
from trials.config._shares import (
    ALLOWED_SHARES,
    ALLOWED_SLOTS_PER_TRIAL,
    EIGHTHS_PER_SLOT,
    SLOT_SHARES,
    format_share,
    is_slot_share,
    share_problem,
    slot_eighths,
    slot_share_of,
)
from trials.config._storage_url import is_url
from trials.config._validation import ConfigModel, validation_problems

if TYPE_CHECKING:
    from trials.config._experiment import (
        DEFAULT_PRIORITY,
        DEFAULT_WEIGHT,
        MAX_TRIALS,
        CategoricalHP,
        ConfigError,
        ConstHP,
        DoubleHP,
        ExperimentConfig,
        Hyperparameter,
        IntHP,
        LogHP,
        ObjectiveConfig,
        PrunerConfig,
        ResourcesConfig,
        SearcherConfig,
        grid_count_problems,
        load_config,
        parse_config,
    )
    from trials.config._stored import (
        StoredConfigError,
        read_stored_config,
        read_stored_hyperparameters,
        read_stored_resources,
    )
    from trials.config._yaml import YamlError, parse_yaml, read_yaml

# Loaded on first use: a rank needs only the eager names above.
_LAZY = {
    **dict.fromkeys(
        (
            "DEFAULT_PRIORITY",
            "DEFAULT_WEIGHT",
            "MAX_TRIALS",
            "CategoricalHP",
            "ConfigError",
            "ConstHP",
            "DoubleHP",
            "ExperimentConfig",
            "Hyperparameter",
            "IntHP",
            "LogHP",
            "ObjectiveConfig",
            "PrunerConfig",
            "ResourcesConfig",
            "SearcherConfig",
            "grid_count_problems",
            "is_url",
            "load_config",
            "parse_config",
        ),
        "trials.config._experiment",
    ),
    "StoredConfigError": "trials.config._stored",
    "read_stored_config": "trials.config._stored",
    "read_stored_hyperparameters": "trials.config._stored",
    "read_stored_resources": "trials.config._stored",
    "YamlError": "trials.config._yaml",
    "parse_yaml": "trials.config._yaml",
    "read_yaml": "trials.config._yaml",
}

__all__ = [
    "ALLOWED_SHARES",
    "ALLOWED_SLOTS_PER_TRIAL",
    "DEFAULT_PRIORITY",
    "DEFAULT_WEIGHT",
    "EIGHTHS_PER_SLOT",
    "MAX_TRIALS",
    "NOTIFICATION_EVENTS",
    "SLOT_SHARES",
    "STEPS_PER_SLOT_SECOND",
    "CategoricalHP",
    "CheckpointStorageConfig",
    "ConfigError",
    "ConfigModel",
    "ConstHP",
    "DoubleHP",
    "ExperimentConfig",
    "Hyperparameter",
    "IntHP",
    "IntegrationsConfig",
    "Length",
    "LogHP",
    "MaxLength",
    "MlflowConfig",
    "NotificationConfig",
    "NotificationEvent",
    "ObjectiveConfig",
    "OptimizationsConfig",
    "ProfilingConfig",
    "PrunerConfig",
    "PrunerSpec",
    "ResourcesConfig",
    "RuntimeSpec",
    "SearcherConfig",
    "StoredConfigError",
    "WarmSpec",
    "YamlError",
    "format_share",
    "grid_count_problems",
    "is_slot_share",
    "is_url",
    "load_config",
    "parse_config",
    "parse_yaml",
    "per_slot_batch_size",
    "read_stored_config",
    "read_stored_hyperparameters",
    "read_stored_resources",
    "read_yaml",
    "share_problem",
    "slot_eighths",
    "slot_seconds_step",
    "slot_share_of",
    "validation_problems",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trials.config' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
