"""slotsweep's storage: the models, engines, migrations and checkpoint store.

Everything a search records lives in one SQLAlchemy database, next to the Optuna
study of the same search. This package imports nothing else of slotsweep's.

Example:
    >>> from storage import get_engine, upgrade_schema
    >>> upgrade_schema("sqlite:///example.db")  # doctest: +SKIP
"""

from storage._engine import get_engine, prepare_engine, session_scope
from storage._migrate import upgrade_schema
from storage._models import (
    Allocation,
    Base,
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    ProcessRole,
    SystemMetric,
    Timing,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    utcnow,
)
from storage._optuna import optuna_storage
from storage._records import record_metrics
from storage._url import (
    DB_ENV_VAR,
    DEFAULT_DB_URL,
    absolute_db_url,
    redact_url,
    resolve_db_url,
)

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_DB_URL",
    "Allocation",
    "Base",
    "Checkpoint",
    "CheckpointState",
    "Experiment",
    "ExperimentState",
    "Metric",
    "MetricKind",
    "ProcessRole",
    "SystemMetric",
    "Timing",
    "Trial",
    "TrialProcess",
    "TrialRun",
    "TrialState",
    "absolute_db_url",
    "get_engine",
    "optuna_storage",
    "prepare_engine",
    "record_metrics",
    "redact_url",
    "resolve_db_url",
    "session_scope",
    "upgrade_schema",
    "utcnow",
]
