"""Trials with their hyperparameters and searcher metric: ``slotsweep describe``, the
API's ``Experiment.trials()`` and ``best_trial``, the UI's trials tables.

A trial is a :class:`TrialRow` (typed, for the CLI, the API and the integrations) or,
for the UI's tables, a frame of such rows (:func:`trial_frame`: one ``hp.<name>``
column per hyperparameter). One query answers "the best trials" (:func:`best_trials`)
and one "the trial numbered N" (:func:`trial_id`) for every reader.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> (row,) = experiment_trials(engine, 1)
    >>> row.label, row.state.value, row.searcher_metric
    ('1.0', 'QUEUED', None)
    >>> trial_id(engine, 1, 0), trial_id(engine, 1, 7)
    (1, None)
    >>> list(trial_frame([row]).columns)[:4]
    ['id', 'number', 'state', 'metric']
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from storage import Experiment, Trial, TrialState
from trials.config import StoredConfigError, read_stored_resources
from trials.labels import trial_label
from trials.queries._experiments import typed_config
from trials.queries._reading import Page, Source, enum_value, reading, table

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy.orm import Session

_E = Experiment.__table__
_T = Trial.__table__

# Columns a user may sort the trials table by; anything else is refused, never
# interpolated into SQL.
TRIAL_SORT_COLUMNS: dict[str, sa.ColumnElement[Any]] = {
    "number": _T.c.optuna_trial_number,
    "metric": _T.c.searcher_metric_value,
    "state": _T.c.state,
    "started": _T.c.started_at,
    "batches": _T.c.total_batches,
    "slot_seconds": _T.c.slot_seconds,
    "restarts": _T.c.restarts,
}


@dataclasses.dataclass(frozen=True)
class TrialRow:
    """One trial, numbered as Optuna numbers it within its experiment."""

    id: int
    experiment_id: int
    number: int
    state: TrialState
    #: The searcher metric's final value (None until the trial completes).
    searcher_metric: float | None
    hyperparameters: dict[str, Any]
    restarts: int
    batches: int
    #: Slots held times seconds, over every attempt.
    slot_seconds: float
    slots: int
    started_at: _dt.datetime | None
    ended_at: _dt.datetime | None
    #: Why the trial failed (None unless it did).
    error: str | None
    #: The share of one slot a share search's trial holds (1.0: ``slots`` whole slots).
    share: float = 1.0

    @property
    def size(self) -> int | float:
        """What the trial holds in slots: ``slots``, or its share of one (0.25)."""
        return self.slots if self.share == 1.0 else self.slots * self.share

    @property
    def label(self) -> str:
        """``EXPERIMENT.NUMBER``, as the logs, the CLI and the UI name the trial."""
        return trial_label(self.experiment_id, self.number)

    @property
    def duration_s(self) -> float | None:
        """Seconds from its first start to its end; None until it has both."""
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


_COLUMNS = (
    _T.c.id,
    _T.c.experiment_id,
    _T.c.optuna_trial_number,
    _T.c.state,
    _T.c.searcher_metric_value,
    _T.c.hparams,
    _T.c.restarts,
    _T.c.total_batches,
    _T.c.slot_seconds,
    _T.c.slots_per_trial,
    _T.c.started_at,
    _T.c.ended_at,
    _T.c.error,
)


def _trial_row(row: Any, share: float = 1.0) -> TrialRow:
    return TrialRow(
        id=row.id,
        experiment_id=row.experiment_id,
        number=row.optuna_trial_number,
        state=TrialState(enum_value(row.state)),
        searcher_metric=row.searcher_metric_value,
        hyperparameters=dict(row.hparams or {}),
        restarts=row.restarts,
        batches=row.total_batches,
        slot_seconds=row.slot_seconds,
        slots=row.slots_per_trial,
        started_at=row.started_at,
        ended_at=row.ended_at,
        error=row.error,
        share=share,
    )


def _trial_rows(conn: sa.Connection | Session, rows: Sequence[Any]) -> list[TrialRow]:
    """``rows`` as :class:`TrialRow`, each with its experiment's share of a slot (one
    read of the experiments' configs, however many rows)."""
    ids = sorted({row.experiment_id for row in rows})
    configs = conn.execute(sa.select(_E.c.id, _E.c.config).where(_E.c.id.in_(ids))).all()
    shares = {experiment_id: experiment_share(config) for experiment_id, config in configs}
    return [_trial_row(row, shares.get(row.experiment_id, 1.0)) for row in rows]


def experiment_share(config: Any) -> float:
    """The share of a slot an experiment's trials take (1.0: whole slots), from its stored
    config; an unreadable one counts as whole slots.

    Example:
        >>> experiment_share({"resources": {"slots_per_trial": 0.25}}), experiment_share(None)
        (0.25, 1.0)
    """
    try:
        return read_stored_resources(config).slot_share
    except StoredConfigError:
        return 1.0


def experiment_trials(db: Source, experiment_id: int) -> list[TrialRow]:
    """Every trial of the experiment, by number."""
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(*_COLUMNS)
            .where(_T.c.experiment_id == experiment_id)
            .order_by(_T.c.optuna_trial_number)
        ).all()
        return _trial_rows(conn, rows)


def best_trials(
    db: Source, experiment_id: int, *, smaller_is_better: bool, limit: int = 5
) -> list[TrialRow]:
    """The completed trials with the best searcher metric, best first (ties by number).

    ``smaller_is_better`` is the searcher's direction, from the config its caller read.
    """
    value = _T.c.searcher_metric_value
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(*_COLUMNS)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.COMPLETED,
                value.is_not(None),
            )
            .order_by(value.asc() if smaller_is_better else value.desc(), _T.c.optuna_trial_number)
            .limit(limit)
        ).all()
        return _trial_rows(conn, rows)


def trial_id(db: Source, experiment_id: int, number: int) -> int | None:
    """The database id of the experiment's trial numbered ``number``; None when there is none.

    How every reader finds a trial a user named (``EXPERIMENT.NUMBER``, a number).
    """
    with reading(db) as conn:
        found = conn.execute(
            sa.select(_T.c.id).where(
                _T.c.experiment_id == experiment_id, _T.c.optuna_trial_number == number
            )
        ).scalar()
    return None if found is None else int(found)


_FRAME_COLUMNS = [
    "id",
    "number",
    "state",
    "metric",
    "restarts",
    "batches",
    "slot_seconds",
    "slots",
    "started",
    "duration_s",
]


def trial_frame(rows: Sequence[TrialRow]) -> pd.DataFrame:
    """The UI's trials table of ``rows``: :data:`_FRAME_COLUMNS`, then ``hp.<name>`` per
    hyperparameter (by name; a value that is not a number, text or bool as text)."""
    import pandas as pd

    out = []
    for row in rows:
        record = {
            "id": row.id,
            "number": row.number,
            "state": row.state.value,
            "metric": row.searcher_metric,
            "restarts": row.restarts,
            "batches": row.batches,
            "slot_seconds": row.slot_seconds,
            "slots": row.size,
            "started": row.started_at,
            "duration_s": row.duration_s,
        }
        for key, value in sorted(row.hyperparameters.items()):
            record[f"hp.{key}"] = (
                value if isinstance(value, (int, float, str, bool)) else str(value)
            )
        out.append(record)
    return pd.DataFrame(out) if out else table([], _FRAME_COLUMNS)


def list_trials(
    db: Source,
    experiment_id: int,
    *,
    states: Sequence[str] = (),
    sort_by: str = "number",
    descending: bool = False,
    limit: int = 50,
    offset: int = 0,
) -> Page:
    """One page of an experiment's trials, sorted in SQL by a whitelisted column."""
    if sort_by not in TRIAL_SORT_COLUMNS:
        raise ValueError(
            f"sort_by: must be one of {', '.join(TRIAL_SORT_COLUMNS)}, got {sort_by!r}"
        )
    column = TRIAL_SORT_COLUMNS[sort_by]
    order = (column.desc() if descending else column.asc()).nulls_last()
    where = [_T.c.experiment_id == experiment_id]
    if states:
        where.append(_T.c.state.in_(list(states)))
    with reading(db) as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(_T).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(*_COLUMNS)
            .where(*where)
            .order_by(order, _T.c.optuna_trial_number)
            .limit(limit)
            .offset(offset)
        ).all()
        trials = _trial_rows(conn, rows)
    return Page(trial_frame(trials), int(total), offset, limit)


def trials_by_numbers(db: Source, experiment_id: int, numbers: Sequence[int]) -> pd.DataFrame:
    """The trials with the given Optuna trial numbers (e.g. a Pareto front), by number."""
    if not numbers:
        return trial_frame([])
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(*_COLUMNS)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.optuna_trial_number.in_(list(numbers)),
            )
            .order_by(_T.c.optuna_trial_number)
        ).all()
        trials = _trial_rows(conn, rows)
    return trial_frame(trials)


def trials_by_ids(db: Source, trial_ids: Sequence[int]) -> pd.DataFrame:
    """The trials with the given ids (any experiment), with their experiment's id and name."""
    if not trial_ids:
        return trial_frame([]).assign(experiment=[])
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(*_COLUMNS, _E.c.name.label("experiment"))
            .join(_E, _E.c.id == _T.c.experiment_id)
            .where(_T.c.id.in_(list(trial_ids)))
            .order_by(_T.c.experiment_id, _T.c.optuna_trial_number)
        ).all()
        trials = _trial_rows(conn, rows)
    frame = trial_frame(trials)
    frame["experiment_id"] = [row.experiment_id for row in rows]
    frame["experiment"] = [row.experiment for row in rows]
    return frame


def trial_number_range(db: Source, experiment_id: int) -> tuple[int, int] | None:
    """The experiment's lowest and highest trial number; None before its first trial."""
    with reading(db) as conn:
        low, high = conn.execute(
            sa.select(
                sa.func.min(_T.c.optuna_trial_number), sa.func.max(_T.c.optuna_trial_number)
            ).where(_T.c.experiment_id == experiment_id)
        ).one()
    return None if low is None else (int(low), int(high))


def latest_trial_id(db: Source) -> int | None:
    """The most recently created trial, shown when no trial was asked for."""
    with reading(db) as conn:
        value = conn.execute(sa.select(sa.func.max(_T.c.id))).scalar_one()
    return None if value is None else int(value)


def trial_detail(db: Source, trial_id: int) -> dict[str, Any] | None:
    """The trial row with its experiment's name and typed config (``experiment_config``)."""
    with reading(db) as conn:
        row = (
            conn.execute(
                sa.select(
                    _T,
                    _E.c.name.label("experiment_name"),
                    _E.c.config.label("experiment_config"),
                    _E.c.config_path.label("experiment_config_path"),
                )
                .join(_E, _E.c.id == _T.c.experiment_id)
                .where(_T.c.id == trial_id)
            )
            .mappings()
            .first()
        )
    if row is None:
        return None
    detail = dict(row)
    detail["state"] = enum_value(detail["state"])
    # What the trial holds: its slots, or a share search's share of one slot.
    detail["slot_share"] = experiment_share(row["experiment_config"])
    detail["experiment_config"] = typed_config(row["experiment_config"])
    return detail
