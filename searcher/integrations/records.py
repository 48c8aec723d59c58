"""What the exporters read of one experiment: its trials, and each trial's new rows.

TensorBoard (:mod:`searcher.integrations.tensorboard_events`) and MLflow
(:mod:`searcher.integrations.mlflow_runs`) show the same data: read it here, once, as
plain values, so neither holds a database session while it talks to its tool. Rows
come in pages after a per-trial watermark (the last row id already exported): one
writer records each trial's metrics and timings (its rank 0), so ids grow in the order
rows are committed and nothing below a watermark appears later.

Example:
    >>> from storage import session_scope
    >>> with session_scope(url) as session:
    ...     summary = read_experiment(session, 1)
    >>> summary.name, [t.number for t in summary.trials]
    ('digits-large-batch', [0])
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.experiments import UsageError
from storage import Experiment, Metric, SystemMetric, Timing, TrialState
from trials import queries
from trials.config import read_stored_config

# Rows read per trial per pass: a long trial's history is caught up over several passes,
# each short, rather than in one read that holds everything in memory.
PAGE_ROWS = 5000


def epoch_seconds(when: _dt.datetime | None) -> float | None:
    """A database timestamp (naive UTC) as seconds since the epoch.

    Example:
        >>> epoch_seconds(_dt.datetime(1970, 1, 2))
        86400.0
    """
    if when is None:
        return None
    return when.replace(tzinfo=_dt.timezone.utc).timestamp()


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the exporters show it."""

    id: int
    number: int
    label: str
    state: TrialState
    hyperparameters: dict[str, Any]
    searcher_metric: float | None
    failure_reason: str | None
    restarts: int
    slot_seconds: float
    started_at: float | None
    ended_at: float | None


@dataclass(frozen=True)
class ExperimentRecord:
    """An experiment and its trials, read in one session."""

    id: int
    name: str
    state: str
    metric: str
    smaller_is_better: bool
    created_at: float
    #: The config's hyperparameter names (constants included), sorted.
    hyperparameters: tuple[str, ...]
    trials: tuple[TrialRecord, ...]
    #: Counts by state: ``total``, ``queued``, ``running``, ``completed``, ``pruned``, ``errored``.
    counts: dict[str, int] = field(default_factory=dict)
    best_value: float | None = None


@dataclass(frozen=True)
class Point:
    """One value of one series: a metric, a timing or a system sample."""

    id: int
    tag: str
    step: int
    value: float | None
    wall_time: float


def read_experiment(session: Session, experiment_id: int) -> ExperimentRecord:
    """The experiment and its trials (by number); raises UsageError when it does not exist."""
    row = session.get(Experiment, experiment_id)
    if row is None:
        raise UsageError(f"experiment: no experiment with id {experiment_id}")
    config = read_stored_config(row.config)
    searcher = config.searcher
    trials = queries.experiment_trials(session, experiment_id)
    best = queries.best_trials(
        session, experiment_id, smaller_is_better=searcher.smaller_is_better, limit=1
    )
    return ExperimentRecord(
        id=row.id,
        name=row.name,
        state=row.state.value,
        metric=searcher.metric,
        smaller_is_better=searcher.smaller_is_better,
        created_at=epoch_seconds(row.created_at) or 0.0,
        hyperparameters=tuple(sorted(config.hyperparameters)),
        trials=tuple(
            TrialRecord(
                id=t.id,
                number=t.number,
                label=t.label,
                state=t.state,
                hyperparameters=t.hyperparameters,
                searcher_metric=t.searcher_metric,
                failure_reason=t.error,
                restarts=t.restarts,
                slot_seconds=t.slot_seconds,
                started_at=epoch_seconds(t.started_at),
                ended_at=epoch_seconds(t.ended_at),
            )
            for t in trials
        ),
        counts=vars(queries.trial_counts(session, experiment_id)),
        best_value=best[0].searcher_metric if best else None,
    )


def metric_points(session: Session, trial_id: int, after_id: int) -> list[Point]:
    """The trial's metrics recorded after row ``after_id``, tagged ``<kind>/<name>``."""
    rows = session.execute(
        select(Metric.id, Metric.kind, Metric.name, Metric.step, Metric.value, Metric.recorded_at)
        .where(Metric.trial_id == trial_id, Metric.id > after_id)
        .order_by(Metric.id)
        .limit(PAGE_ROWS)
    ).all()
    return [
        Point(r.id, f"{r.kind.value}/{r.name}", r.step, r.value, _wall(r.recorded_at))
        for r in rows
    ]


def timing_points(session: Session, trial_id: int, after_id: int) -> list[Point]:
    """The trial's phase timings after row ``after_id``: mean seconds per window, at its end step."""
    rows = session.execute(
        select(Timing.id, Timing.name, Timing.end_step, Timing.mean_s, Timing.recorded_at)
        .where(Timing.trial_id == trial_id, Timing.id > after_id)
        .order_by(Timing.id)
        .limit(PAGE_ROWS)
    ).all()
    return [
        Point(r.id, f"timings/{r.name}_s", r.end_step, r.mean_s, _wall(r.recorded_at))
        for r in rows
    ]


def system_points(
    session: Session, trial_id: int, after_id: int, started_at: float | None
) -> list[Point]:
    """The trial's system samples after row ``after_id``; the step is seconds into the trial."""
    rows = session.execute(
        select(
            SystemMetric.id,
            SystemMetric.agent,
            SystemMetric.gpu_index,
            SystemMetric.name,
            SystemMetric.value,
            SystemMetric.recorded_at,
        )
        .where(SystemMetric.trial_id == trial_id, SystemMetric.id > after_id)
        .order_by(SystemMetric.id)
        .limit(PAGE_ROWS)
    ).all()
    points = []
    for r in rows:
        wall = _wall(r.recorded_at)
        device = f"/gpu{r.gpu_index}" if r.gpu_index is not None else ""
        step = max(0, int(wall - started_at)) if started_at is not None else 0
        points.append(Point(r.id, f"system/{r.agent}{device}/{r.name}", step, r.value, wall))
    return points


def _wall(when: _dt.datetime) -> float:
    seconds = epoch_seconds(when)
    assert seconds is not None
    return seconds
