"""What trials recorded by step: a trial's metrics (the API's ``Experiment.metrics``),
its curves and several trials' (the Trial and Compare pages), an experiment's learning
curves and its best value after each trial.

Curves are downsampled in SQL (:func:`_step_bucket`): a long run stays a light chart
and only the buckets come into Python.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> list(metric_rows(engine, 1).columns)
    ['step', 'epoch', 'kind', 'name', 'value', 'recorded_at']
    >>> learning_curves(engine, 1, "validation_loss", smaller_is_better=True).trials_total
    1
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from storage import Metric, MetricKind, Trial, TrialState
from trials.queries._reading import Source, enum_value, frame_of, reading, table

if TYPE_CHECKING:
    import pandas as pd

_T = Trial.__table__
_M = Metric.__table__

_METRIC_ROW_COLUMNS = ["step", "epoch", "kind", "name", "value", "recorded_at"]


def metric_rows(db: Source, trial_id: int) -> pd.DataFrame:
    """Every metric the trial recorded: one row per step, kind and name.

    Columns: ``step``, ``epoch``, ``kind`` (``training`` or ``validation``), ``name``,
    ``value`` (NaN where training diverged) and ``recorded_at``.
    """
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(_M.c.step, _M.c.epoch, _M.c.kind, _M.c.name, _M.c.value, _M.c.recorded_at)
            .where(_M.c.trial_id == trial_id)
            .order_by(_M.c.step, _M.c.kind, _M.c.name)
        ).all()
    frame = table(
        [(r.step, r.epoch, enum_value(r.kind), r.name, r.value, r.recorded_at) for r in rows],
        _METRIC_ROW_COLUMNS,
    )
    frame["value"] = frame["value"].astype(float)  # NULL (a NaN recorded) reads as NaN
    return frame


def metric_names(db: Source, trial_id: int) -> pd.DataFrame:
    """Which metrics a trial recorded: kind, name, row count, step range, epochs known."""
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(
                    _M.c.kind,
                    _M.c.name,
                    sa.func.count().label("rows"),
                    sa.func.min(_M.c.step).label("min_step"),
                    sa.func.max(_M.c.step).label("max_step"),
                    sa.func.count(_M.c.epoch).label("with_epoch"),
                )
                .where(_M.c.trial_id == trial_id)
                .group_by(_M.c.kind, _M.c.name)
                .order_by(_M.c.kind, _M.c.name)
            )
        ).assign(kind=lambda df: df["kind"].map(enum_value))


_CURVE_COLUMNS = ["name", "step", "epoch", "value"]


def metric_curves(
    db: Source,
    trial_id: int,
    kind: MetricKind | str,
    names: Sequence[str],
    *,
    max_points: int = 400,
) -> pd.DataFrame:
    """Metric values by step, downsampled in SQL to about ``max_points`` per metric.

    Rows are already averaged across ranks by the runtime; buckets of consecutive
    steps are averaged again here so a long run stays a light chart. Columns: name,
    step (first step of the bucket), epoch (mean, may be NaN), value (mean).
    """
    if not names:
        return table([], _CURVE_COLUMNS)
    where = [_M.c.trial_id == trial_id, _M.c.kind == MetricKind(kind), _M.c.name.in_(list(names))]
    with reading(db) as conn:
        bucket = _step_bucket(conn, where, max_points)
        if bucket is None:
            return table([], _CURVE_COLUMNS)
        return frame_of(
            conn.execute(
                sa.select(
                    _M.c.name,
                    sa.func.min(_M.c.step).label("step"),
                    sa.func.avg(_M.c.epoch).label("epoch"),
                    sa.func.avg(_M.c.value).label("value"),
                )
                .where(*where)
                .group_by(_M.c.name, bucket)
                .order_by(_M.c.name, sa.func.min(_M.c.step))
            )
        )


def trials_metric_curves(
    db: Source,
    trial_ids: Sequence[int],
    kind: MetricKind | str,
    *,
    max_points: int = 200,
) -> pd.DataFrame:
    """Every metric of ``kind`` for several trials, each curve downsampled in SQL.

    Columns: trial_id, name, step, value. For overlaying trials on the Compare page.
    """
    import pandas as pd

    frames = [
        metric_curves(
            db,
            trial_id,
            kind,
            list(names["name"][names["kind"] == MetricKind(kind).value]),
            max_points=max_points,
        ).assign(trial_id=trial_id)
        for trial_id in trial_ids
        for names in [metric_names(db, trial_id)]
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return table([], ["trial_id", "name", "step", "epoch", "value"])
    return pd.concat(frames, ignore_index=True)


def _step_bucket(conn: Any, where: list[Any], max_points: int) -> Any:
    """A GROUP BY key putting the metric rows of ``where`` into at most ``max_points``
    step buckets (downsampling in SQL); None when no row matches."""
    low, high = conn.execute(
        sa.select(sa.func.min(_M.c.step), sa.func.max(_M.c.step)).where(*where)
    ).one()
    if low is None:
        return None
    width = max(1, math.ceil((high - low + 1) / max(1, max_points)))
    return ((_M.c.step - low) // width) if width > 1 else _M.c.step


@dataclasses.dataclass(frozen=True)
class LearningCurves:
    """The searcher metric of (a sample of) an experiment's trials against their step.

    ``points`` has one row per trial and step bucket: ``trial_id``, ``number``,
    ``state``, ``step``, ``epoch``, ``value``, ``best`` (the best completed trial),
    ``stopped`` (the last point of a pruned trial: where ASHA stopped it).
    ``hyperparameters`` holds each shown trial's, by number (the chart's tooltip).
    """

    points: pd.DataFrame
    kind: str | None
    trials_total: int
    trials_shown: int
    stride: int
    best_number: int | None
    hyperparameters: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


_LEARNING_CURVE_COLUMNS = [
    "trial_id",
    "number",
    "state",
    "step",
    "epoch",
    "value",
    "best",
    "stopped",
]


def learning_curves(
    db: Source,
    experiment_id: int,
    metric: str,
    *,
    smaller_is_better: bool,
    max_trials: int = 200,
    max_points: int = 60,
    include: Sequence[int] = (),
) -> LearningCurves:
    """Every trial's ``metric`` by step, or every n-th trial's when there are more than
    ``max_trials`` (the best trial and the trial numbers in ``include`` always).

    Only trial rows come into Python; the metric rows are downsampled in SQL to about
    ``max_points`` buckets of steps per trial. The metric is read from the validation
    rows when the trials validate it (the searcher metric usually is), else training.
    """
    with reading(db) as conn:
        trials = conn.execute(
            sa.select(
                _T.c.id,
                _T.c.optuna_trial_number,
                _T.c.state,
                _T.c.searcher_metric_value,
                _T.c.hparams,
            ).where(_T.c.experiment_id == experiment_id)
        ).all()
        finished = [
            t
            for t in trials
            if enum_value(t.state) == TrialState.COMPLETED.value
            and t.searcher_metric_value is not None
        ]
        best = (
            (min if smaller_is_better else max)(finished, key=lambda t: t.searcher_metric_value)
            if finished
            else None
        )
        stride = max(1, math.ceil(len(trials) / max(1, max_trials)))
        keep = set(include) | ({best.optuna_trial_number} if best is not None else set())
        shown = {
            t.id: t
            for t in trials
            if t.optuna_trial_number % stride == 0 or t.optuna_trial_number in keep
        }
        empty = LearningCurves(
            table([], _LEARNING_CURVE_COLUMNS), None, len(trials), 0, stride, None
        )
        if not shown:
            return empty
        ids = list(shown)
        kinds = {
            enum_value(k)
            for (k,) in conn.execute(
                sa.select(_M.c.kind).where(_M.c.trial_id.in_(ids), _M.c.name == metric).distinct()
            )
        }
        if not kinds:
            return empty
        kind = (
            MetricKind.VALIDATION if MetricKind.VALIDATION.value in kinds else MetricKind.TRAINING
        )
        where = [_M.c.trial_id.in_(ids), _M.c.kind == kind, _M.c.name == metric]
        bucket = _step_bucket(conn, where, max_points)
        if bucket is None:
            return empty
        frame = frame_of(
            conn.execute(
                sa.select(
                    _M.c.trial_id,
                    sa.func.max(_M.c.step).label("step"),
                    sa.func.max(_M.c.epoch).label("epoch"),
                    sa.func.avg(_M.c.value).label("value"),
                )
                .where(*where)
                .group_by(_M.c.trial_id, bucket)
                .order_by(_M.c.trial_id, sa.func.max(_M.c.step))
            )
        )
    frame["number"] = [shown[i].optuna_trial_number for i in frame["trial_id"]]
    frame["state"] = [enum_value(shown[i].state) for i in frame["trial_id"]]
    frame["best"] = best is not None and frame["number"] == best.optuna_trial_number
    last = ~frame["trial_id"].duplicated(keep="last")
    frame["stopped"] = last & (frame["state"] == TrialState.PRUNED.value)
    return LearningCurves(
        points=frame[_LEARNING_CURVE_COLUMNS],
        kind=kind.value,
        trials_total=len(trials),
        trials_shown=int(frame["trial_id"].nunique()),
        stride=stride,
        best_number=None if best is None else int(best.optuna_trial_number),
        hyperparameters={t.optuna_trial_number: dict(t.hparams or {}) for t in shown.values()},
    )


def best_so_far(db: Source, experiment_id: int, *, smaller_is_better: bool) -> pd.DataFrame:
    """The experiment's best searcher metric after every trial that ended.

    One row per ended trial, in the order they ended: ``trials`` counts the ended
    trials so far, ``slot_seconds`` the compute they used, ``best`` the best value so
    far (None until a trial completes) and ``improved`` whether this trial set it. Two
    searches compare by how many trials and how much compute each needed to reach a
    value.
    """
    ended = (
        sa.select(
            _T.c.optuna_trial_number.label("number"),
            _T.c.ended_at,
            sa.case((_T.c.state == TrialState.COMPLETED, _T.c.searcher_metric_value)).label(
                "value"
            ),
            sa.func.row_number().over(order_by=(_T.c.ended_at, _T.c.id)).label("trials"),
            sa.func.sum(_T.c.slot_seconds)
            .over(order_by=(_T.c.ended_at, _T.c.id))
            .label("slot_seconds"),
        )
        .where(_T.c.experiment_id == experiment_id, _T.c.ended_at.is_not(None))
        .subquery()
    )
    running = (sa.func.min if smaller_is_better else sa.func.max)(ended.c.value).over(
        order_by=ended.c.trials
    )
    with_best = sa.select(ended, running.label("best")).subquery()
    previous = sa.func.lag(with_best.c.best).over(order_by=with_best.c.trials)
    flagged = sa.select(with_best, previous.label("previous")).subquery()
    improved = sa.and_(
        flagged.c.best.is_not(None),
        sa.or_(flagged.c.previous.is_(None), flagged.c.best != flagged.c.previous),
    )
    with reading(db) as conn:
        frame = frame_of(
            conn.execute(
                sa.select(
                    flagged.c.number,
                    flagged.c.trials,
                    flagged.c.slot_seconds,
                    flagged.c.best,
                    flagged.c.ended_at,
                    sa.case((improved, True), else_=False).label("improved"),
                ).order_by(flagged.c.trials)
            )
        )
    if not frame.empty:
        frame["improved"] = frame["improved"].astype(bool)
    return frame
