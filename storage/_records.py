"""Writes that must be idempotent, because a restarted trial records the same steps again."""

from __future__ import annotations

import datetime as _dt
import importlib
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage._models import FusionChoice, Metric, MetricKind, utcnow


def metric_rows(
    trial_id: int,
    step: int,
    kind: MetricKind,
    values: Mapping[str, float],
    epoch: float | None = None,
    *,
    recorded_at: _dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """The ``Metric`` rows of one step's values, as :func:`record_metrics` writes them.

    A NaN value (training diverged) becomes NULL, which readers take as NaN. Bulk
    writers (the UI's benchmark data) build their rows here too, so their rows cannot
    drift from the runtime's; ``recorded_at`` defaults to now.

    Example:
        >>> [row["value"] for row in metric_rows(1, 10, MetricKind.TRAINING, {"loss": 0.5})]
        [0.5]
    """
    at = utcnow() if recorded_at is None else recorded_at
    return [
        {
            "trial_id": trial_id,
            "step": step,
            "epoch": epoch,
            "kind": kind,
            "name": name,
            "value": None if math.isnan(value) else float(value),
            "recorded_at": at,
        }
        for name, value in values.items()
    ]


def record_metrics(
    session: Session,
    trial_id: int,
    step: int,
    kind: MetricKind,
    values: Mapping[str, float],
    epoch: float | None = None,
) -> None:
    """Insert or replace one step's metrics; a key (trial, step, kind, name) exists once.

    A NaN value (training diverged) is stored as NULL, which readers take as NaN.

    Example:
        >>> from storage import session_scope
        >>> with session_scope(url) as session:
        ...     record_metrics(session, trial_id=1, step=100, kind=MetricKind.VALIDATION,
        ...                    values={"val_loss": 0.3})
        ...     record_metrics(session, trial_id=1, step=100, kind=MetricKind.VALIDATION,
        ...                    values={"val_loss": 0.25})  # replaces the first
        >>> with session_scope(url) as session:
        ...     [(m.name, m.value) for m in session.query(Metric)]
        [('val_loss', 0.25)]
    """
    if not values:
        return
    rows = metric_rows(trial_id, step, kind, values, epoch)
    dialect = session.get_bind().dialect.name
    if dialect not in ("sqlite", "postgresql"):
        raise NotImplementedError(f"metrics upsert is not implemented for {dialect}")
    # The backend's own dialect module, loaded by its engine anyway: importing both up
    # front cost every SQLite process (a trial's rank 0 among them) PostgreSQL's dialects.
    insert: Any = importlib.import_module(f"sqlalchemy.dialects.{dialect}").insert(Metric)
    statement = insert.values(rows)
    statement = statement.on_conflict_do_update(
        index_elements=["trial_id", "step", "kind", "name"],
        set_={
            "value": statement.excluded.value,
            "epoch": statement.excluded.epoch,
            "recorded_at": statement.excluded.recorded_at,
        },
    )
    session.execute(statement)


def fusion_choice(
    session: Session, experiment_id: int, shape_key: str, world_size: int
) -> float | None:
    """The DDP bucket size (MB) a trial of the experiment chose for a model shape and size."""
    return session.scalar(
        select(FusionChoice.bucket_mb).where(
            FusionChoice.experiment_id == experiment_id,
            FusionChoice.shape_key == shape_key,
            FusionChoice.world_size == world_size,
        )
    )


def keep_first_fusion_choice(session: Session, choice: FusionChoice) -> None:
    """Record ``choice`` unless a trial of its experiment recorded one for its key first.

    Two trials of one shape that probe at the same time both measure; the first choice
    recorded stays (the unique key refuses the second, which is not an error).
    """
    known = fusion_choice(session, choice.experiment_id, choice.shape_key, choice.world_size)
    if known is not None:
        return
    try:
        # A savepoint: on PostgreSQL another trial may insert between the select and
        # this insert (SQLite's writes are serialised).
        with session.begin_nested():
            session.add(choice)
    except IntegrityError:
        pass
