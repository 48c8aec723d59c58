"""The one gateway to Optuna's data: every read of a study, its trials, params and values.

Optuna's public API comes first: :func:`study_trials`, :func:`study_user_attrs` and
:func:`optuna_trial_id` read through :class:`optuna.storages.RDBStorage` and hand out
:class:`optuna.trial.FrozenTrial` (and the study's user attributes).
Two reads of the UI cannot meet its target of a page under 2 s at 10,000 trials that
way, so they read Optuna's tables with plain SQL: :func:`read_study` (every trial, for
Optuna's plots; ``RDBStorage.get_all_trials`` builds an ORM object per row and took
6.1 s for 10,000 trials with ten reports each where the SQL takes 1.6 s, on a busy
2-core machine) and :func:`study_signature` (counts that tell the UI's caches when a
study changed, on every render). Both first read the Alembic revision of Optuna's
tables, the one Optuna itself checks before it opens a storage, and refuse any
revision outside :data:`KNOWN_OPTUNA_SCHEMAS` with :class:`OptunaSchemaError`, one
line naming the revisions they know. Nothing here touches a private Optuna attribute.

Optuna is imported lazily, as in :func:`storage.optuna_storage`: most processes that
import ``storage`` never read a study.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import functools
import json
import math
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from storage._engine import get_engine
from storage._optuna import optuna_storage

if TYPE_CHECKING:
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial, TrialState

# Alembic revisions of Optuna's tables that the SQL below was written against, and the
# Optuna releases whose storage is at that revision. v3.2.0.a is the head from Optuna
# 3.2 to 5.0 (CI reads it with the oldest and the newest Optuna pyproject.toml allows).
KNOWN_OPTUNA_SCHEMAS: dict[str, str] = {"v3.2.0.a": "Optuna 3.2 to 5.0"}


class OptunaSchemaError(RuntimeError):
    """Optuna's tables are at a schema revision the gateway's SQL was not written for."""


@dataclasses.dataclass(frozen=True)
class StudySignature:
    """Fingerprints of a stored Optuna study, so cached plots know when to refresh.

    ``everything`` changes with any change to the study's trials (a new trial, a
    report, a finished trial); ``completed`` only when a trial completes, which is all
    that the plots of completed trials (history, importances, parallel coordinates,
    Pareto front) depend on.
    """

    study_id: int | None
    everything: tuple[Any, ...] = ()
    completed: tuple[Any, ...] = ()
    trials: int = 0
    objectives: int = 1

    @property
    def exists(self) -> bool:
        return self.study_id is not None


@dataclasses.dataclass(frozen=True)
class StudyRecord:
    """A stored study as Optuna's plots need it: directions, metric names, every trial.

    ``trials`` are ordered by number and read-only: those read with SQL are deep-copied
    shallowly (see :func:`_snapshot_trial_type`), so nothing may write to them.
    """

    name: str
    directions: list[StudyDirection]
    metric_names: list[str] | None
    trials: list[FrozenTrial]


def optuna_schema_revision(connection: Connection) -> str | None:
    """The Alembic revision of Optuna's tables, or None where they do not exist yet.

    Read from Optuna's ``alembic_version`` table (slotsweep's own migrations keep theirs
    in ``slotsweep_alembic_version``), as Alembic's ``MigrationContext`` reads it, but
    without configuring a migration context on every page render (0.4 ms, not 2.8 ms).
    """
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    revisions = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
    # One row on Optuna's linear history; several (branches) match no known revision.
    return ",".join(sorted(revisions)) or None


def check_optuna_schema(connection: Connection) -> bool:
    """Whether Optuna's tables exist; :class:`OptunaSchemaError` if at an unknown revision."""
    revision = optuna_schema_revision(connection)
    if revision is None:
        return False
    if revision not in KNOWN_OPTUNA_SCHEMAS:
        known = ", ".join(f"{rev} ({where})" for rev, where in KNOWN_OPTUNA_SCHEMAS.items())
        raise OptunaSchemaError(
            f"Optuna's tables in this database are at schema revision {revision}; "
            f"slotsweep reads only {known}"
        )
    return True


def _engine(url_or_engine: str | Engine) -> Engine:
    if isinstance(url_or_engine, Engine):
        return url_or_engine
    return get_engine(url_or_engine, read_only=True)


def study_signature(url_or_engine: str | Engine, study_name: str) -> StudySignature:
    """The study's :class:`StudySignature`, from Optuna's tables (plain SQL, a few ms).

    A study that does not exist, or a database without Optuna's tables, gives a
    signature whose ``exists`` is false.
    """
    with _engine(url_or_engine).connect() as conn:
        if not check_optuna_schema(conn):
            return StudySignature(None)
        study_id = conn.execute(
            sa.text("SELECT study_id FROM studies WHERE study_name = :name"), {"name": study_name}
        ).scalar()
        if study_id is None:
            return StudySignature(None)
        trials = conn.execute(
            sa.text(
                "SELECT COUNT(*), MAX(trial_id), MAX(datetime_complete),"
                " SUM(CASE WHEN state = 'RUNNING' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN state = 'COMPLETE' THEN 1 ELSE 0 END),"
                " MAX(CASE WHEN state = 'COMPLETE' THEN datetime_complete END)"
                " FROM trials WHERE study_id = :sid"
            ),
            {"sid": study_id},
        ).one()
        reports = conn.execute(
            sa.text(
                "SELECT COUNT(*) FROM trial_intermediate_values v"
                " JOIN trials t ON t.trial_id = v.trial_id WHERE t.study_id = :sid"
            ),
            {"sid": study_id},
        ).scalar_one()
        objectives = conn.execute(
            sa.text("SELECT COUNT(*) FROM study_directions WHERE study_id = :sid"),
            {"sid": study_id},
        ).scalar_one()
    return StudySignature(
        study_id=int(study_id),
        everything=(*tuple(trials[:4]), reports),
        completed=tuple(trials[4:]),
        trials=int(trials[0]),
        objectives=max(1, int(objectives)),
    )


def read_study(url: str, study_name: str) -> StudyRecord:
    """Every trial of a stored study, in one short read-only transaction.

    Plain SELECTs over Optuna's tables (at a known schema revision, else
    :class:`OptunaSchemaError`). Should the rows not make a study Optuna would build
    (trial numbers with a gap, a state or value type it does not name), the study is
    read through Optuna's storage instead. A study that does not exist raises KeyError.
    """
    import optuna

    try:
        record = _read_study_tables(url, study_name)
    except (sa.exc.SQLAlchemyError, KeyError, ValueError):
        # Rows Optuna's own storage turns into a study, or into an error of its own.
        stored = optuna.load_study(
            study_name=study_name, storage=optuna_storage(url, read_only=True)
        )
        return StudyRecord(
            name=study_name,
            directions=list(stored.directions),
            metric_names=stored.metric_names,
            trials=stored.get_trials(deepcopy=False),
        )
    if record is None:
        raise KeyError(f"no Optuna study named {study_name!r}")
    return record


def study_trials(
    url: str, study_name: str, states: Collection[TrialState] | None = None
) -> list[FrozenTrial] | None:
    """The study's trials (those in ``states``, if given) through Optuna's public storage.

    None when the study does not exist or the database has no Optuna tables.
    """
    with get_engine(url, read_only=True).connect() as conn:
        if optuna_schema_revision(conn) is None:
            return None  # Optuna's storage would not open: it checks its version table.
    storage = optuna_storage(url, read_only=True)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return None
    return list(storage.get_all_trials(study_id, deepcopy=False, states=states))


def study_user_attrs(url: str, study_name: str) -> dict[str, Any]:
    """The study's user attributes through Optuna's public storage ({} without the study).

    Multi-objective pruning records each trial's rung decisions there (``trials.pruning``).
    """
    with get_engine(url, read_only=True).connect() as conn:
        if optuna_schema_revision(conn) is None:
            return {}
    storage = optuna_storage(url, read_only=True)
    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return {}
    return dict(storage.get_study_user_attrs(study_id))


def optuna_trial_id(url: str, study_name: str, number: int) -> int:
    """Optuna's storage id of trial ``number`` of the study (what its storage calls take).

    Optuna keeps the id in a private attribute of its trials; its storage API maps the
    study's name and the trial's number to it.
    """
    storage = optuna_storage(url, read_only=True)
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study_name), number
    )


# --------------------------------------------------------------- Optuna's tables, read raw
_SPECIAL_VALUES = {"INF_POS": math.inf, "INF_NEG": -math.inf, "NAN": math.nan}


def _stored_float(value: float | None, value_type: str) -> float:
    return (
        float(value)
        if value_type == "FINITE" and value is not None
        else _SPECIAL_VALUES[value_type]
    )


def _stored_datetime(value: Any) -> _dt.datetime | None:
    # SQLite hands back text through a plain SELECT; PostgreSQL a datetime.
    if value is None or isinstance(value, _dt.datetime):
        return value
    return _dt.datetime.fromisoformat(str(value))


@functools.cache
def _snapshot_trial_type() -> type[FrozenTrial]:
    """A FrozenTrial whose deep copy is a shallow one, for trials of a read-only snapshot.

    ``InMemoryStorage`` deep-copies every trial it stores and every trial
    ``get_trials()`` returns, which for 10,000 trials cost more than reading them.
    Nothing writes to a snapshot, and Optuna's plots only read trials, so copies may
    share a trial's dicts. Made on first use: the module does not import Optuna itself.
    """
    from optuna.trial import FrozenTrial

    class SnapshotTrial(FrozenTrial):
        def __deepcopy__(self, memo: dict[int, Any]) -> SnapshotTrial:
            return copy.copy(self)

    return SnapshotTrial


def _read_study_tables(url: str, study_name: str) -> StudyRecord | None:
    """The study's directions, metric names and trials, straight from Optuna's tables.

    None when there is no such study (or no Optuna tables at all).
    """
    from optuna.study import StudyDirection

    by_trial = "FROM {table} x JOIN trials t ON t.trial_id = x.trial_id WHERE t.study_id = :sid"
    with get_engine(url, read_only=True).connect() as conn:
        if not check_optuna_schema(conn):
            return None
        study_id = conn.execute(
            sa.text("SELECT study_id FROM studies WHERE study_name = :name"), {"name": study_name}
        ).scalar()
        if study_id is None:
            return None
        sid = {"sid": study_id}
        directions = [
            StudyDirection[name]
            for (name,) in conn.execute(
                sa.text(
                    "SELECT direction FROM study_directions WHERE study_id = :sid ORDER BY objective"
                ),
                sid,
            )
        ]
        names_json = conn.execute(
            sa.text(
                "SELECT value_json FROM study_system_attributes"
                " WHERE study_id = :sid AND key = 'study:metric_names'"
            ),
            sid,
        ).scalar()
        trial_rows = conn.execute(
            sa.text(
                "SELECT trial_id, number, state, datetime_start, datetime_complete"
                " FROM trials WHERE study_id = :sid ORDER BY number"
            ),
            sid,
        ).all()
        rows = {
            table: conn.execute(
                sa.text(f"SELECT {columns} " + by_trial.format(table=table)), sid
            ).all()
            for table, columns in (
                ("trial_params", "x.trial_id, x.param_name, x.param_value, x.distribution_json"),
                ("trial_values", "x.trial_id, x.objective, x.value, x.value_type"),
                (
                    "trial_intermediate_values",
                    "x.trial_id, x.step, x.intermediate_value, x.intermediate_value_type",
                ),
            )
        }
        constraints = conn.execute(
            sa.text(
                "SELECT x.trial_id, x.value_json "
                + by_trial.format(table="trial_system_attributes")
                + " AND x.key = 'constraints'"
            ),
            sid,
        ).all()
    return StudyRecord(
        name=study_name,
        directions=directions,
        metric_names=json.loads(names_json) if names_json else None,
        trials=_frozen_trials(
            trial_rows,
            rows["trial_params"],
            rows["trial_values"],
            rows["trial_intermediate_values"],
            {trial_id: json.loads(text) for trial_id, text in constraints},
        ),
    )


def _frozen_trials(
    trial_rows: Collection[Any],
    params: Collection[tuple[Any, ...]],
    values: Collection[tuple[Any, ...]],
    reports: Collection[tuple[Any, ...]],
    constraints: dict[int, Any],
) -> list[FrozenTrial]:
    """Snapshot trials built from the rows of Optuna's trial tables, as its storage would."""
    from optuna.distributions import json_to_distribution
    from optuna.trial import TrialState

    snapshot_trial = _snapshot_trial_type()
    distributions: dict[str, Any] = {}  # Parsed once per distinct JSON, not once per row.
    trial_params: dict[int, dict[str, Any]] = {}
    trial_distributions: dict[int, dict[str, Any]] = {}
    for trial_id, name, internal, dist_json in params:
        dist = distributions.get(dist_json) or distributions.setdefault(
            dist_json, json_to_distribution(dist_json)
        )
        trial_params.setdefault(trial_id, {})[name] = dist.to_external_repr(internal)
        trial_distributions.setdefault(trial_id, {})[name] = dist
    trial_values: dict[int, dict[int, float]] = {}
    for trial_id, objective, value, value_type in values:
        trial_values.setdefault(trial_id, {})[objective] = _stored_float(value, value_type)
    trial_reports: dict[int, dict[int, float]] = {}
    for trial_id, step, value, value_type in reports:
        trial_reports.setdefault(trial_id, {})[step] = _stored_float(value, value_type)
    trials = []
    for position, (trial_id, number, state, started, completed) in enumerate(trial_rows):
        if number != position:
            raise ValueError(f"trial numbers are not contiguous at {number}")
        objective_values = trial_values.get(trial_id)
        trials.append(
            snapshot_trial(
                number=number,
                trial_id=trial_id,
                state=TrialState[state],
                value=None,
                values=[objective_values[i] for i in sorted(objective_values)]
                if objective_values
                else None,
                datetime_start=_stored_datetime(started),
                datetime_complete=_stored_datetime(completed),
                params=trial_params.get(trial_id, {}),
                distributions=trial_distributions.get(trial_id, {}),
                user_attrs={},
                system_attrs=(
                    {"constraints": constraints[trial_id]} if trial_id in constraints else {}
                ),
                intermediate_values=trial_reports.get(trial_id, {}),
            )
        )
    return trials
