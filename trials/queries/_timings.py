"""Where a trial's time went, and what its machines did: the profiler's timing windows
and the system metrics sampled on each agent (the Trial page's profile).

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> timing_breakdown(engine, 1).empty, system_metric_summary(engine, 1).empty
    (True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from storage import SystemMetric, Timing
from trials.queries._reading import Source, frame_of, reading

if TYPE_CHECKING:
    import pandas as pd

_TI = Timing.__table__
_S = SystemMetric.__table__


def timing_breakdown(db: Source, trial_id: int) -> pd.DataFrame:
    """Per profiled phase: batches timed, weighted mean, median window p50, worst p95, total.

    The runtime records windowed aggregates, so the mean over the trial is the
    count-weighted mean of the windows; p50 and p95 cannot be merged exactly, so the
    table shows the mean of window p50s and the largest window p95.
    """
    with reading(db) as conn:
        frame = frame_of(
            conn.execute(
                sa.select(
                    _TI.c.name.label("phase"),
                    sa.func.count().label("windows"),
                    sa.func.sum(_TI.c.count).label("batches"),
                    (
                        sa.func.sum(_TI.c.mean_s * _TI.c.count)
                        / sa.func.nullif(sa.func.sum(_TI.c.count), 0)
                    ).label("mean_s"),
                    sa.func.avg(_TI.c.p50_s).label("p50_s"),
                    sa.func.max(_TI.c.p95_s).label("p95_s"),
                    sa.func.sum(_TI.c.total_s).label("total_s"),
                )
                .where(_TI.c.trial_id == trial_id)
                .group_by(_TI.c.name)
                .order_by(sa.func.sum(_TI.c.total_s).desc())
            )
        )
    if not frame.empty:
        grand = float(frame["total_s"].sum())
        frame["share"] = frame["total_s"] / grand if grand > 0 else 0.0
    return frame


def timing_series(db: Source, trial_id: int, *, max_windows: int = 300) -> pd.DataFrame:
    """Mean seconds per phase by window end step, the newest ``max_windows`` windows per phase."""
    ranked = (
        sa.select(
            _TI.c.name,
            _TI.c.end_step,
            _TI.c.mean_s,
            sa.func.row_number()
            .over(partition_by=_TI.c.name, order_by=_TI.c.end_step.desc())
            .label("rank"),
        )
        .where(_TI.c.trial_id == trial_id)
        .subquery()
    )
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(ranked.c.name, ranked.c.end_step, ranked.c.mean_s)
                .where(ranked.c.rank <= max_windows)
                .order_by(ranked.c.name, ranked.c.end_step)
            )
        )


def system_metric_summary(db: Source, trial_id: int) -> pd.DataFrame:
    """Per agent, GPU (empty for host metrics) and metric: samples, mean, max, last time."""
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(
                    _S.c.agent,
                    _S.c.gpu_index,
                    _S.c.name,
                    sa.func.count().label("samples"),
                    sa.func.avg(_S.c.value).label("mean"),
                    sa.func.max(_S.c.value).label("max"),
                    sa.func.max(_S.c.recorded_at).label("last_recorded"),
                )
                .where(_S.c.trial_id == trial_id)
                .group_by(_S.c.agent, _S.c.gpu_index, _S.c.name)
                .order_by(_S.c.agent, _S.c.gpu_index, _S.c.name)
            )
        )


def system_metric_series(
    db: Source, trial_id: int, name: str, *, max_points: int = 300
) -> pd.DataFrame:
    """One system metric over time per agent/GPU, the newest ``max_points`` samples each."""
    ranked = (
        sa.select(
            _S.c.agent,
            _S.c.gpu_index,
            _S.c.recorded_at,
            _S.c.value,
            sa.func.row_number()
            .over(
                partition_by=(_S.c.agent, _S.c.gpu_index),
                order_by=_S.c.recorded_at.desc(),
            )
            .label("rank"),
        )
        .where(_S.c.trial_id == trial_id, _S.c.name == name)
        .subquery()
    )
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(ranked.c.agent, ranked.c.gpu_index, ranked.c.recorded_at, ranked.c.value)
                .where(ranked.c.rank <= max_points)
                .order_by(ranked.c.agent, ranked.c.gpu_index, ranked.c.recorded_at)
            )
        )
