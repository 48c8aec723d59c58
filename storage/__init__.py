"""slotsweep's storage: the models, engines, migrations and checkpoint store.

Everything a search records lives in one SQLAlchemy database, next to the Optuna
study of the same search. Every read of that study goes through :mod:`storage.studies`
(Optuna's public API, or SQL gated on the schema revision of Optuna's tables). This
package imports nothing else of slotsweep's.

Example:
    >>> import sqlalchemy as sa
    >>> from storage import get_engine, upgrade_schema
    >>> db = f"sqlite:///{folder}/example.db"
    >>> upgrade_schema(db)
    >>> "slotsweep_experiments" in sa.inspect(get_engine(db)).get_table_names()
    True
"""

from storage._engine import (
    TRANSIENT_DEADLINE_S,
    DatabaseUnavailableError,
    get_engine,
    is_transient_error,
    prepare_engine,
    retry_transient,
    session_scope,
)
from storage._fence import (
    FENCED_EXIT_CODE,
    AttemptSupersededError,
    RanksFencedError,
    claim_attempt,
    claimed_slots,
    start_ranks,
    stop_requested,
)
from storage._migrate import upgrade_schema
from storage._models import (
    Allocation,
    Base,
    Checkpoint,
    CheckpointState,
    Diagnosis,
    Experiment,
    ExperimentState,
    FusionChoice,
    Metric,
    MetricKind,
    ProcessRole,
    QueuedTrial,
    SystemMetric,
    Timing,
    Trial,
    TrialFailure,
    TrialProcess,
    TrialRun,
    TrialState,
    WarmJob,
    utc_from_timestamp,
    utcnow,
)
from storage._open import DatabaseUrlError, check_database_url
from storage._optuna import optuna_storage, optuna_writes_together
from storage._records import fusion_choice, keep_first_fusion_choice, metric_rows, record_metrics
from storage._url import (
    DB_ENV_VAR,
    DEFAULT_DB_URL,
    absolute_db_url,
    redact_secrets,
    redact_url,
    resolve_db_url,
    url_secrets,
)
from storage._warm_jobs import contesting_trial, end_earlier_processes
from storage.studies import (
    KNOWN_OPTUNA_SCHEMAS,
    OptunaSchemaError,
    StudyRecord,
    StudySignature,
    check_optuna_schema,
    optuna_schema_revision,
    optuna_trial_id,
    read_study,
    study_signature,
    study_trials,
    study_user_attrs,
)

__all__ = [
    "DB_ENV_VAR",
    "DEFAULT_DB_URL",
    "FENCED_EXIT_CODE",
    "KNOWN_OPTUNA_SCHEMAS",
    "TRANSIENT_DEADLINE_S",
    "Allocation",
    "AttemptSupersededError",
    "Base",
    "Checkpoint",
    "CheckpointState",
    "DatabaseUnavailableError",
    "DatabaseUrlError",
    "Diagnosis",
    "Experiment",
    "ExperimentState",
    "FusionChoice",
    "Metric",
    "MetricKind",
    "OptunaSchemaError",
    "ProcessRole",
    "QueuedTrial",
    "RanksFencedError",
    "StudyRecord",
    "StudySignature",
    "SystemMetric",
    "Timing",
    "Trial",
    "TrialFailure",
    "TrialProcess",
    "TrialRun",
    "TrialState",
    "WarmJob",
    "absolute_db_url",
    "check_database_url",
    "check_optuna_schema",
    "claim_attempt",
    "claimed_slots",
    "contesting_trial",
    "end_earlier_processes",
    "fusion_choice",
    "get_engine",
    "is_transient_error",
    "keep_first_fusion_choice",
    "metric_rows",
    "optuna_schema_revision",
    "optuna_storage",
    "optuna_trial_id",
    "optuna_writes_together",
    "prepare_engine",
    "read_study",
    "record_metrics",
    "redact_secrets",
    "redact_url",
    "resolve_db_url",
    "retry_transient",
    "session_scope",
    "start_ranks",
    "stop_requested",
    "study_signature",
    "study_trials",
    "study_user_attrs",
    "upgrade_schema",
    "url_secrets",
    "utc_from_timestamp",
    "utcnow",
]
