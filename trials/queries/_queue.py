"""The cluster's queue: what waits for slots and why (``slotsweep task list`` and
``describe``, the Cluster page, the Experiment page's waiting trials).

The queue table is read only through :func:`trials.coordination.cluster_queue.queue_view`,
so every reader orders it and words its reasons as the scheduler does.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> queue_views(engine), list(queued_trials(engine).columns)[:3]
    ([], ['position', 'trial', 'trial_id'])
    >>> waiting_trials(engine, 1).rows[["trial", "reason"]].values.tolist()
    [['1.0', 'waiting for the next placement decision']]
"""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING

import sqlalchemy as sa

from storage import Experiment, QueuedTrial, Trial, TrialState, utcnow
from trials.config import ResourcesConfig, format_share
from trials.coordination.cluster_queue import QueuedView, queue_view, waiting_reason
from trials.labels import trial_label
from trials.queries._experiments import typed_config
from trials.queries._reading import Page, Source, enum_value, orm_session, reading, table

if TYPE_CHECKING:
    import pandas as pd

_E = Experiment.__table__
_T = Trial.__table__
_Q = QueuedTrial.__table__


def queue_views(db: Source, experiment_id: int | None = None) -> list[QueuedView]:
    """The cluster's queue in the order trials start (pool, priority, arrival), or the
    part of it that is ``experiment_id``'s, with the scheduler's latest reasons."""
    with orm_session(db) as session:
        return queue_view(session, experiment_id=experiment_id)


def waited_s(view: QueuedView, now: _dt.datetime) -> float:
    """Seconds the trial has waited in the queue at ``now``, to a tenth.

    Example:
        >>> import datetime as dt
        >>> view = QueuedView("default", 1, "e", 7, 0, 1, 42, 1.0, dt.datetime(2026, 1, 1), (), None)
        >>> waited_s(view, dt.datetime(2026, 1, 1, 0, 1, 15, 40000))
        75.0
    """
    return round(max(0.0, (now - view.queued_at).total_seconds()), 1)


_QUEUE_COLUMNS = [
    "position",
    "trial",
    "trial_id",
    "experiment_id",
    "experiment",
    "pool",
    "priority",
    "slots",
    "share",
    "waiting_s",
    "reason",
]


def queued_trials(db: Source, *, now: _dt.datetime | None = None) -> pd.DataFrame:
    """The cluster's queue in the order trials start (pool, priority, arrival), and why.

    One row per trial in the queue, numbered as ``slotsweep task list`` numbers them,
    with the scheduler's latest reason in its words (``"placed on a0; starting"`` once a
    decision has claimed its slots).
    """
    now = utcnow() if now is None else now
    rows = [
        {
            "position": position,
            "trial": view.label,
            "trial_id": view.trial_id,
            "experiment_id": view.experiment_id,
            "experiment": view.experiment_name,
            "pool": view.pool,
            "priority": view.priority,
            "slots": view.slots,
            # A share of one slot in words (1/4); nothing for whole slots.
            "share": format_share(view.share) if view.share < 1.0 else "",
            "waiting_s": waited_s(view, now),
            "reason": view.shown_reason,
        }
        for position, view in enumerate(queue_views(db), start=1)
    ]
    return table(rows, _QUEUE_COLUMNS)


def queued_outside_queue(db: Source) -> pd.DataFrame:
    """QUEUED trials that have no row in the cluster's queue, counted per experiment.

    A paused experiment's driver took its trials out of the queue; a running search's
    newest trials enter it at its driver's next tick. ``reason`` says which.
    Columns: experiment_id, experiment, state, trials, reason.
    """
    in_queue = sa.select(_Q.c.trial_id).where(_Q.c.trial_id == _T.c.id).exists()
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(_E.c.id, _E.c.name, _E.c.state, sa.func.count().label("trials"))
            .join(_T, _T.c.experiment_id == _E.c.id)
            .where(_T.c.state == TrialState.QUEUED, ~in_queue)
            .group_by(_E.c.id, _E.c.name, _E.c.state)
            .order_by(_E.c.id)
        ).all()
    return table(
        [
            {
                "experiment_id": row.id,
                "experiment": row.name,
                "state": enum_value(row.state),
                "trials": int(row.trials),
                "reason": waiting_reason(None, enum_value(row.state)),
            }
            for row in rows
        ],
        ["experiment_id", "experiment", "state", "trials", "reason"],
    )


_WAITING_COLUMNS = ["id", "trial", "number", "slots", "priority", "waiting_s", "reason"]


def waiting_trials(
    db: Source, experiment_id: int, *, limit: int = 500, now: _dt.datetime | None = None
) -> Page:
    """The experiment's QUEUED trials and why each waits, in the order they would start.

    Trials in the cluster's queue come first, in its order, with the scheduler's reason
    and how long they have waited there; then those without a queue row, by number
    (``"experiment paused"``, or ``"waiting for the next placement decision"`` until the
    driver's next tick queues them: their wait is not known). At most ``limit`` rows.
    """
    now = utcnow() if now is None else now
    queued = _T.c.experiment_id == experiment_id, _T.c.state == TrialState.QUEUED
    with reading(db) as conn:
        experiment = conn.execute(
            sa.select(_E.c.state, _E.c.config).where(_E.c.id == experiment_id)
        ).first()
        if experiment is None:
            return Page(table([], _WAITING_COLUMNS), 0, 0, limit)
        total = conn.execute(
            sa.select(sa.func.count()).select_from(_T).where(*queued)
        ).scalar_one()
        trials = conn.execute(
            sa.select(_T.c.id, _T.c.optuna_trial_number, _T.c.slots_per_trial)
            .where(*queued)
            .order_by(_T.c.optuna_trial_number)
            .limit(limit)
        ).all()
    if not trials:
        return Page(table([], _WAITING_COLUMNS), 0, 0, limit)
    views = {view.trial_id: view for view in queue_views(db, experiment_id)}
    order = {trial_id: position for position, trial_id in enumerate(views)}
    state = enum_value(experiment.state)
    # The driver queues its trials at the experiment's priority (``resources.priority``).
    config = typed_config(experiment.config)
    resources = ResourcesConfig() if config is None else config.resources
    priority, share = resources.priority, resources.slot_share
    rows = []
    for trial in sorted(
        trials, key=lambda t: (order.get(t.id, len(order)), t.optuna_trial_number)
    ):
        view = views.get(trial.id)
        rows.append(
            {
                "id": trial.id,
                "trial": trial_label(experiment_id, trial.optuna_trial_number),
                "number": trial.optuna_trial_number,
                # A share search's trial waits for its share of one slot (0.25).
                "slots": trial.slots_per_trial * share if share < 1.0 else trial.slots_per_trial,
                "priority": priority if view is None else view.priority,
                "waiting_s": None if view is None else waited_s(view, now),
                "reason": waiting_reason(view, state),
            }
        )
    return Page(table(rows, _WAITING_COLUMNS), int(total), 0, limit)
