"""The UI's reads: every query pages with LIMIT/OFFSET or aggregates in SQL.

Nothing here imports Streamlit, so the queries are tested and benchmarked as plain
functions. Each function opens its own short connection and closes it before
returning: a read transaction left open would pin an old WAL snapshot and keep SQLite
from checkpointing while the driver and trials write.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> page = list_experiments(engine, limit=50, offset=0)
    >>> page.total, list(page.rows.columns)[:3]
    (1, ['id', 'name', 'state'])
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Collection, Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from storage import (
    Allocation,
    Checkpoint,
    Diagnosis,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    QueuedTrial,
    SystemMetric,
    Timing,
    Trial,
    TrialFailure,
    TrialRun,
    TrialState,
    WarmJob,
    utcnow,
)
from trials.config import (
    EIGHTHS_PER_SLOT,
    ExperimentConfig,
    ResourcesConfig,
    SearcherConfig,
    StoredConfigError,
    format_share,
    read_stored_config,
    read_stored_resources,
)
from trials.coordination.allocations import (
    WARM_RESERVED,
    WARM_RUNNING,
    trial_holds,
    warm_state_column,
)
from trials.coordination.cluster_queue import QueuedView, queue_view, waiting_reason
from trials.labels import trial_label
from ui import _format
from ui._units import duration_words

_E = Experiment.__table__
_T = Trial.__table__
_R = TrialRun.__table__
_M = Metric.__table__
_C = Checkpoint.__table__
_A = Allocation.__table__
_TI = Timing.__table__
_S = SystemMetric.__table__
_F = TrialFailure.__table__
_Q = QueuedTrial.__table__
_W = WarmJob.__table__
_D = Diagnosis.__table__

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
class Page:
    """One page of a table: its rows and how many rows the whole table has."""

    rows: pd.DataFrame
    total: int
    offset: int
    limit: int


@dataclasses.dataclass(frozen=True)
class ExperimentSummary:
    """One experiment with its trial counts, as the Experiment page's header shows it."""

    id: int
    name: str
    study_name: str
    state: str
    max_trials: int
    created_at: _dt.datetime
    ended_at: _dt.datetime | None
    #: The stored config, typed; None when this version cannot read it.
    config: ExperimentConfig | None
    #: The config as stored, shown as it is.
    stored_config: dict[str, Any]
    requested_action: str | None
    driver_host: str | None
    driver_pid: int | None
    driver_heartbeat_at: _dt.datetime | None
    counts: dict[str, int]
    #: Slots its trials hold now, a share of a slot at its fraction.
    slots_in_use: float
    best_value: float | None

    @property
    def metric(self) -> str:
        return metric_name(self.config)

    @property
    def smaller_is_better(self) -> bool:
        return smaller_is_better(self.config)

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s.value, 0) for s in TrialState if s.is_terminal)


def typed_config(stored: Any) -> ExperimentConfig | None:
    """An experiment's stored config, typed; None when this version cannot read it.

    A page shows what it can of such an experiment (its config edited by hand, or
    written by a newer version) rather than failing.
    """
    try:
        return read_stored_config(stored)
    except StoredConfigError:
        return None


def metric_name(config: ExperimentConfig | None) -> str:
    """The searcher metric's name; ``"metric"`` when the config does not read."""
    return "metric" if config is None else config.searcher.metric


def smaller_is_better(config: ExperimentConfig | None) -> bool:
    """The searcher metric's direction; the model's default when the config does not read."""
    if config is None:
        return bool(SearcherConfig.model_fields["smaller_is_better"].default)
    return config.searcher.smaller_is_better


def _frame(result: sa.CursorResult[Any]) -> pd.DataFrame:
    return pd.DataFrame(result.mappings().all(), columns=list(result.keys()))


def _state_counts_columns() -> list[sa.ColumnElement[Any]]:
    return [
        sa.func.sum(sa.case((_T.c.state == state, 1), else_=0)).label(state.value.lower())
        for state in TrialState
    ]


def _count_dict(row: Any) -> dict[str, int]:
    return {state.value: int(row[state.value.lower()] or 0) for state in TrialState}


def has_schema(engine: Engine) -> bool:
    """Whether slotsweep's tables exist (a fresh or foreign database has none)."""
    return sa.inspect(engine).has_table(Experiment.__tablename__)


def experiment_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(_E)).scalar_one())


_EXPERIMENT_COLUMNS = [
    "id",
    "name",
    "state",
    "progress",
    "done",
    "completed",
    "running",
    "queued",
    "pruned",
    "failed",
    "best",
    "metric",
    "slots_in_use",
    "started",
    "ended",
    "requested_action",
]


def list_experiments(
    engine: Engine,
    *,
    states: Sequence[str] = (),
    name_contains: str = "",
    limit: int = 50,
    offset: int = 0,
) -> Page:
    """Experiments newest first, with trial counts, best value and slots in use.

    Filtering and paging happen in SQL; the counts are aggregated only for the
    experiments on the page.
    """
    where = _experiment_filter(states, name_contains)
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(_E).where(*where)).scalar_one()
        experiments = conn.execute(
            sa.select(
                _E.c.id,
                _E.c.name,
                _E.c.state,
                _E.c.max_trials,
                _E.c.created_at,
                _E.c.ended_at,
                _E.c.config,
                _E.c.requested_action,
            )
            .where(*where)
            .order_by(_E.c.id.desc())
            .limit(limit)
            .offset(offset)
        ).all()
        ids = [row.id for row in experiments]
        counts = _trial_aggregates(conn, ids)
        slots: dict[int, float] = dict(
            conn.execute(
                sa.select(_A.c.experiment_id, _slots_held())
                .where(_A.c.experiment_id.in_(ids))
                .group_by(_A.c.experiment_id)
            ).all()
        )
    rows = [
        _experiment_row(exp, counts.get(exp.id), _slots(slots.get(exp.id))) for exp in experiments
    ]
    return Page(pd.DataFrame(rows, columns=_EXPERIMENT_COLUMNS), int(total), offset, limit)


def _experiment_filter(states: Sequence[str], name_contains: str) -> list[sa.ColumnElement[bool]]:
    """The WHERE of the experiments list: any of ``states``, a name containing the text."""
    where: list[sa.ColumnElement[bool]] = []
    if states:
        where.append(_E.c.state.in_(list(states)))
    if name_contains:
        escaped = name_contains.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append(_E.c.name.ilike(f"%{escaped}%", escape="\\"))
    return where


def _trial_aggregates(conn: sa.Connection, ids: Sequence[int]) -> dict[int, Any]:
    """Per experiment: trial counts by state and the smallest and largest completed value."""
    completed_value = sa.case((_T.c.state == TrialState.COMPLETED, _T.c.searcher_metric_value))
    return {
        row.experiment_id: row
        for row in conn.execute(
            sa.select(
                _T.c.experiment_id,
                *_state_counts_columns(),
                sa.func.min(completed_value).label("min_value"),
                sa.func.max(completed_value).label("max_value"),
            )
            .where(_T.c.experiment_id.in_(list(ids)))
            .group_by(_T.c.experiment_id)
        ).mappings()
    }


def _slots_held() -> sa.ColumnElement[Any]:
    """SQL: the slots a group of ledger rows holds, a share at its fraction (exact)."""
    return (sa.func.sum(_A.c.eighths) / sa.literal(float(EIGHTHS_PER_SLOT))).label("slots")


def _slots(held: Any) -> int | float:
    """Slots held as shown: a whole number as an int, shares as a fraction (0.75)."""
    value = float(held or 0)
    return int(value) if value.is_integer() else value


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


def _share_of(conn: sa.Connection, experiment_id: int) -> float:
    """The share of a slot the experiment's trials take (:func:`experiment_share`)."""
    config = conn.execute(sa.select(_E.c.config).where(_E.c.id == experiment_id)).scalar()
    return experiment_share(config)


def _experiment_row(exp: Any, agg: Any, slots_in_use: float) -> dict[str, Any]:
    """One row of the experiments list, from its experiment row and trial aggregates."""
    count = _count_dict(agg) if agg is not None else {s.value: 0 for s in TrialState}
    config = typed_config(exp.config)
    smaller = smaller_is_better(config)
    best = None if agg is None else (agg["min_value"] if smaller else agg["max_value"])
    finished = sum(count[s.value] for s in TrialState if s.is_terminal)
    return {
        "id": exp.id,
        "name": exp.name,
        "state": shown_state(_enum_value(exp.state), count),
        "progress": finished / exp.max_trials if exp.max_trials else 0.0,
        "done": f"{finished}/{exp.max_trials}",
        "completed": count["COMPLETED"],
        "running": count["RUNNING"],
        "queued": count["QUEUED"],
        "pruned": count["PRUNED"],
        "failed": count["ERROR"],
        "best": best,
        "metric": None if config is None else config.searcher.metric,
        "slots_in_use": slots_in_use,
        "started": exp.created_at,
        "ended": exp.ended_at,
        "requested_action": exp.requested_action,
    }


def shown_state(state: str, counts: dict[str, int]) -> str:
    """The state to show: ERROR for a finished experiment whose every trial failed.

    Drivers before ERROR existed wrote COMPLETED when the trials ran out, failed or not;
    such a search did not succeed, and must not look as if it had.
    """
    failed, completed = counts.get("ERROR", 0), counts.get("COMPLETED", 0)
    if state == "COMPLETED" and failed > 0 and completed == 0:
        return "ERROR"
    return state


def experiment_choices(engine: Engine, limit: int = 500) -> list[tuple[int, str]]:
    """(id, name) of the newest experiments, for a picker."""
    with engine.connect() as conn:
        return [
            (int(row.id), str(row.name))
            for row in conn.execute(
                sa.select(_E.c.id, _E.c.name).order_by(_E.c.id.desc()).limit(limit)
            )
        ]


def experiment_summary(engine: Engine, experiment_id: int) -> ExperimentSummary | None:
    """The experiment row with its trial counts, best value and slots in use."""
    with engine.connect() as conn:
        exp = conn.execute(sa.select(_E).where(_E.c.id == experiment_id)).first()
        if exp is None:
            return None
        agg = (
            conn.execute(
                sa.select(
                    *_state_counts_columns(),
                    sa.func.min(
                        sa.case((_T.c.state == TrialState.COMPLETED, _T.c.searcher_metric_value))
                    ).label("min_value"),
                    sa.func.max(
                        sa.case((_T.c.state == TrialState.COMPLETED, _T.c.searcher_metric_value))
                    ).label("max_value"),
                ).where(_T.c.experiment_id == experiment_id)
            )
            .mappings()
            .one()
        )
        slots = conn.execute(
            sa.select(_slots_held()).where(_A.c.experiment_id == experiment_id)
        ).scalar_one()
    config = typed_config(exp.config)
    return ExperimentSummary(
        id=exp.id,
        name=exp.name,
        study_name=exp.study_name,
        state=_enum_value(exp.state),
        max_trials=exp.max_trials,
        created_at=exp.created_at,
        ended_at=exp.ended_at,
        config=config,
        stored_config=dict(exp.config or {}),
        requested_action=exp.requested_action,
        driver_host=exp.driver_host,
        driver_pid=exp.driver_pid,
        driver_heartbeat_at=exp.driver_heartbeat_at,
        counts=_count_dict(agg),
        slots_in_use=_slots(slots),
        best_value=agg["min_value"] if smaller_is_better(config) else agg["max_value"],
    )


_TRIAL_ROW_COLUMNS = [
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


def _trial_rows(rows: Sequence[Any], share: float = 1.0) -> pd.DataFrame:
    """Trial rows as the tables show them; ``share``: their experiment's share of a slot
    (``slots`` then shows it: 0.25)."""
    out = []
    for row in rows:
        started, ended = row.started_at, row.ended_at
        record = {
            "id": row.id,
            "number": row.optuna_trial_number,
            "state": _enum_value(row.state),
            "metric": row.searcher_metric_value,
            "restarts": row.restarts,
            "batches": row.total_batches,
            "slot_seconds": row.slot_seconds,
            "slots": row.slots_per_trial if share == 1.0 else row.slots_per_trial * share,
            "started": started,
            "duration_s": (ended - started).total_seconds() if started and ended else None,
        }
        for key, value in sorted((row.hparams or {}).items()):
            record[f"hp.{key}"] = (
                value if isinstance(value, (int, float, str, bool)) else str(value)
            )
        out.append(record)
    return pd.DataFrame(out) if out else pd.DataFrame(columns=_TRIAL_ROW_COLUMNS)


_TRIAL_LIST_COLUMNS = (
    _T.c.id,
    _T.c.optuna_trial_number,
    _T.c.state,
    _T.c.searcher_metric_value,
    _T.c.restarts,
    _T.c.total_batches,
    _T.c.slot_seconds,
    _T.c.slots_per_trial,
    _T.c.started_at,
    _T.c.ended_at,
    _T.c.hparams,
)


def best_trials(
    engine: Engine, experiment_id: int, *, smaller_is_better: bool, limit: int = 10
) -> pd.DataFrame:
    """The completed trials with the best searcher metric, best first."""
    order = (
        _T.c.searcher_metric_value.asc()
        if smaller_is_better
        else _T.c.searcher_metric_value.desc()
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(*_TRIAL_LIST_COLUMNS)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.COMPLETED,
                _T.c.searcher_metric_value.is_not(None),
            )
            .order_by(order, _T.c.optuna_trial_number)
            .limit(limit)
        ).all()
        share = _share_of(conn, experiment_id)
    return _trial_rows(rows, share)


def list_trials(
    engine: Engine,
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
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(_T).where(*where)).scalar_one()
        rows = conn.execute(
            sa.select(*_TRIAL_LIST_COLUMNS)
            .where(*where)
            .order_by(order, _T.c.optuna_trial_number)
            .limit(limit)
            .offset(offset)
        ).all()
        share = _share_of(conn, experiment_id)
    return Page(_trial_rows(rows, share), int(total), offset, limit)


def trials_by_numbers(engine: Engine, experiment_id: int, numbers: Sequence[int]) -> pd.DataFrame:
    """The trials with the given Optuna trial numbers (e.g. a Pareto front), by number."""
    if not numbers:
        return _trial_rows([])
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(*_TRIAL_LIST_COLUMNS)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.optuna_trial_number.in_(list(numbers)),
            )
            .order_by(_T.c.optuna_trial_number)
        ).all()
        share = _share_of(conn, experiment_id)
    return _trial_rows(rows, share)


def trial_number_range(engine: Engine, experiment_id: int) -> tuple[int, int] | None:
    with engine.connect() as conn:
        low, high = conn.execute(
            sa.select(
                sa.func.min(_T.c.optuna_trial_number), sa.func.max(_T.c.optuna_trial_number)
            ).where(_T.c.experiment_id == experiment_id)
        ).one()
    return None if low is None else (int(low), int(high))


def latest_trial_id(engine: Engine) -> int | None:
    """The most recently created trial, shown when no trial was asked for."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(sa.func.max(_T.c.id))).scalar_one()
    return None if value is None else int(value)


def trial_detail(engine: Engine, trial_id: int) -> dict[str, Any] | None:
    """The trial row with its experiment's name and typed config (``experiment_config``)."""
    with engine.connect() as conn:
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
    detail["state"] = _enum_value(detail["state"])
    share = experiment_share(row["experiment_config"])
    # What the trial holds: its slots, or its share of one slot.
    detail["slot_share"] = share
    detail["experiment_config"] = typed_config(row["experiment_config"])
    return detail


def metric_names(engine: Engine, trial_id: int) -> pd.DataFrame:
    """Which metrics a trial recorded: kind, name, row count, step range, epochs known."""
    with engine.connect() as conn:
        return _frame(
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
        ).assign(kind=lambda df: df["kind"].map(_enum_value))


def metric_curves(
    engine: Engine,
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
        return pd.DataFrame(columns=["name", "step", "epoch", "value"])
    where = [_M.c.trial_id == trial_id, _M.c.kind == MetricKind(kind), _M.c.name.in_(list(names))]
    with engine.connect() as conn:
        bucket = _step_bucket(conn, where, max_points)
        if bucket is None:
            return pd.DataFrame(columns=["name", "step", "epoch", "value"])
        frame = _frame(
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
    return frame


def checkpoints(engine: Engine, trial_id: int, *, limit: int = 100) -> pd.DataFrame:
    """A trial's checkpoints, newest step first."""
    with engine.connect() as conn:
        frame = _frame(
            conn.execute(
                sa.select(
                    _C.c.uuid,
                    _C.c.step,
                    _C.c.epoch,
                    _C.c.state,
                    _C.c.size_bytes,
                    _C.c.path,
                    _C.c.metrics,
                    _C.c.created_at,
                )
                .where(_C.c.trial_id == trial_id)
                .order_by(_C.c.step.desc())
                .limit(limit)
            )
        )
    if not frame.empty:
        frame["state"] = frame["state"].map(_enum_value)
    return frame


def trial_runs(engine: Engine, trial_id: int, *, limit: int = 100) -> pd.DataFrame:
    """Every launch of a trial (attempt 0 is the first run, each restart adds one)."""
    with engine.connect() as conn:
        frame = _frame(
            conn.execute(
                sa.select(
                    _R.c.attempt,
                    _R.c.started_at,
                    _R.c.ended_at,
                    _R.c.exit_code,
                    _R.c.restored_from_checkpoint,
                    _R.c.restored_from_step,
                    _R.c.agents,
                    _R.c.reason,
                    _R.c.executor,
                    _R.c.external_id,
                )
                .where(_R.c.trial_id == trial_id)
                .order_by(_R.c.attempt)
                .limit(limit)
            )
        )
    if not frame.empty:
        frame["agents"] = frame["agents"].map(lambda a: ", ".join(map(_node_label, a or [])))
    return frame


def _node_label(node: Any) -> str:
    """One node of a launch: the driver records ``{"agent", "host", "slots", "pid", ...}``."""
    if not isinstance(node, dict):
        return str(node)  # Rows written before launches recorded their slots: a bare name.
    slots = node.get("slots")
    where = str(node.get("agent") or node.get("host") or "?")
    return f"{where} slots {','.join(map(str, slots))}" if slots else where


def timing_breakdown(engine: Engine, trial_id: int) -> pd.DataFrame:
    """Per profiled phase: batches timed, weighted mean, median window p50, worst p95, total.

    The runtime records windowed aggregates, so the mean over the trial is the
    count-weighted mean of the windows; p50 and p95 cannot be merged exactly, so the
    table shows the mean of window p50s and the largest window p95.
    """
    with engine.connect() as conn:
        frame = _frame(
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


def timing_series(engine: Engine, trial_id: int, *, max_windows: int = 300) -> pd.DataFrame:
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
    with engine.connect() as conn:
        return _frame(
            conn.execute(
                sa.select(ranked.c.name, ranked.c.end_step, ranked.c.mean_s)
                .where(ranked.c.rank <= max_windows)
                .order_by(ranked.c.name, ranked.c.end_step)
            )
        )


def system_metric_summary(engine: Engine, trial_id: int) -> pd.DataFrame:
    """Per agent, GPU (empty for host metrics) and metric: samples, mean, max, last time."""
    with engine.connect() as conn:
        return _frame(
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
    engine: Engine, trial_id: int, name: str, *, max_points: int = 300
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
    with engine.connect() as conn:
        return _frame(
            conn.execute(
                sa.select(ranked.c.agent, ranked.c.gpu_index, ranked.c.recorded_at, ranked.c.value)
                .where(ranked.c.rank <= max_points)
                .order_by(ranked.c.agent, ranked.c.gpu_index, ranked.c.recorded_at)
            )
        )


def _warm_state() -> sa.ColumnElement[Any]:
    # What a warm job does with the slot (``trials.coordination.allocations.SlotHolder.warm_state``);
    # the query outer-joins ``_W`` on the row's ``warm_job_id``.
    return warm_state_column().label("warm_state")


def _trial_holds(state: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    # An idle or ending warm job's row keeps the last trial it ran, which is over.
    return sa.or_(state.is_(None), state.in_([WARM_RUNNING, WARM_RESERVED]))


def _without_finished_trials(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Blank the trial of the rows an idle or ending warm job holds (its last trial is over)."""
    if frame.empty:
        return frame
    idle = [not trial_holds(None if pd.isna(state) else state) for state in frame["warm_state"]]
    if not any(idle):
        return frame
    frame = frame.astype({column: object for column in columns})
    frame.loc[idle, list(columns)] = None
    return frame


def allocations(engine: Engine, *, limit: int = 500, offset: int = 0) -> Page:
    """Held slots with the trial and experiment holding each.

    A warm job's slots carry the job (``warm_job_id``, ``warm_state``); while the job
    is idle or ending no trial holds them (``trial_id`` and the trial's columns are None).
    """
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(_A)).scalar_one()
        frame = _frame(
            conn.execute(
                sa.select(
                    _A.c.resource_pool.label("pool"),
                    _A.c.agent,
                    _A.c.host,
                    _A.c.slot,
                    (_A.c.eighths / sa.literal(float(EIGHTHS_PER_SLOT))).label("share"),
                    _A.c.experiment_id,
                    _E.c.name.label("experiment"),
                    _A.c.trial_id,
                    _T.c.optuna_trial_number.label("trial_number"),
                    _T.c.state.label("trial_state"),
                    _A.c.warm_job_id,
                    _warm_state(),
                    _A.c.allocated_at,
                    _A.c.lease_expires_at,
                )
                .join(_T, _T.c.id == _A.c.trial_id)
                .outerjoin(_E, _E.c.id == _A.c.experiment_id)
                .outerjoin(_W, _W.c.id == _A.c.warm_job_id)
                .order_by(_A.c.resource_pool, _A.c.agent, _A.c.slot, _A.c.eighths.desc())
                .limit(limit)
                .offset(offset)
            )
        )
    if not frame.empty:
        frame["trial_state"] = frame["trial_state"].map(_enum_value)
        frame = _without_finished_trials(frame, ["trial_id", "trial_number", "trial_state"])
    return Page(frame, int(total), offset, limit)


def allocation_summary(engine: Engine) -> pd.DataFrame:
    """Per pool and agent: slots held (a share at its fraction), trials and warm jobs
    holding them, the oldest allocation. An idle warm job's slots count for the job, not
    for its last trial."""
    state = warm_state_column()
    with engine.connect() as conn:
        return _frame(
            conn.execute(
                sa.select(
                    _A.c.resource_pool.label("pool"),
                    _A.c.agent,
                    _A.c.host,
                    _slots_held().label("slots_held"),
                    sa.func.count(
                        sa.distinct(sa.case((_trial_holds(state), _A.c.trial_id)))
                    ).label("trials"),
                    sa.func.count(sa.distinct(_A.c.warm_job_id)).label("warm_jobs"),
                    sa.func.min(_A.c.allocated_at).label("since"),
                )
                .outerjoin(_W, _W.c.id == _A.c.warm_job_id)
                .group_by(_A.c.resource_pool, _A.c.agent, _A.c.host)
                .order_by(_A.c.resource_pool, _A.c.agent)
            )
        )


def held_slots(
    engine: Engine, pool: str, agents: Sequence[str]
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(agent, slot) -> its holders, for the agents of one pool (used with the cluster layout).

    A slot held whole has one holder (``share`` 1.0); one that trials share has one per
    share (``share`` 0.5, 0.25, 0.125), the largest first. A warm job's slot carries
    ``warm_job_id`` and ``warm_state`` (running, reserved, idle, ending); an idle or
    ending job's slot names no trial (``trial_id``, ``optuna_trial_number`` and
    ``trial_state`` are None).
    """
    if not agents:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                _A.c.agent,
                _A.c.slot,
                (_A.c.eighths / sa.literal(float(EIGHTHS_PER_SLOT))).label("share"),
                _A.c.trial_id,
                _A.c.experiment_id,
                _T.c.optuna_trial_number,
                _T.c.state.label("trial_state"),
                _E.c.name.label("experiment"),
                _A.c.warm_job_id,
                _warm_state(),
            )
            .join(_T, _T.c.id == _A.c.trial_id)
            .outerjoin(_E, _E.c.id == _A.c.experiment_id)
            .outerjoin(_W, _W.c.id == _A.c.warm_job_id)
            .where(_A.c.resource_pool == pool, _A.c.agent.in_(list(agents)))
            .order_by(_A.c.agent, _A.c.slot, _A.c.eighths.desc(), _A.c.id)
        ).mappings()
        held: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in rows:
            holder = {**row, "trial_state": _enum_value(row["trial_state"])}
            if not trial_holds(row["warm_state"]):
                holder.update(trial_id=None, optuna_trial_number=None, trial_state=None)
            held.setdefault((row["agent"], int(row["slot"])), []).append(holder)
        return held


# --- The cluster's queue: what waits for slots, and why --------------------------------

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
    "waiting",
    "reason",
]


def _waited_s(view: QueuedView, now: _dt.datetime) -> float:
    return round(max(0.0, (now - view.queued_at).total_seconds()), 1)


def _queue_views(engine: Engine, experiment_id: int | None = None) -> list[QueuedView]:
    # The queue table is read only through trials.coordination.cluster_queue, so the UI orders and
    # words it exactly as ``slotsweep task list`` does.
    with Session(engine) as session:
        return queue_view(session, experiment_id=experiment_id)


def queued_trials(engine: Engine, *, now: _dt.datetime | None = None) -> pd.DataFrame:
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
            "waiting_s": _waited_s(view, now),
            "waiting": duration_words(_waited_s(view, now)),
            "reason": view.shown_reason,
        }
        for position, view in enumerate(_queue_views(engine), start=1)
    ]
    return pd.DataFrame(rows, columns=_QUEUE_COLUMNS)


def queued_outside_queue(engine: Engine) -> pd.DataFrame:
    """QUEUED trials that have no row in the cluster's queue, counted per experiment.

    A paused experiment's driver took its trials out of the queue; a running search's
    newest trials enter it at its driver's next tick. ``reason`` says which.
    Columns: experiment_id, experiment, state, trials, reason.
    """
    in_queue = sa.select(_Q.c.trial_id).where(_Q.c.trial_id == _T.c.id).exists()
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(_E.c.id, _E.c.name, _E.c.state, sa.func.count().label("trials"))
            .join(_T, _T.c.experiment_id == _E.c.id)
            .where(_T.c.state == TrialState.QUEUED, ~in_queue)
            .group_by(_E.c.id, _E.c.name, _E.c.state)
            .order_by(_E.c.id)
        ).all()
    return pd.DataFrame(
        [
            {
                "experiment_id": row.id,
                "experiment": row.name,
                "state": _enum_value(row.state),
                "trials": int(row.trials),
                "reason": waiting_reason(None, _enum_value(row.state)),
            }
            for row in rows
        ],
        columns=["experiment_id", "experiment", "state", "trials", "reason"],
    )


_WAITING_COLUMNS = [
    "id",
    "trial",
    "number",
    "slots",
    "priority",
    "waiting_s",
    "waiting",
    "reason",
]


def waiting_trials(
    engine: Engine, experiment_id: int, *, limit: int = 500, now: _dt.datetime | None = None
) -> Page:
    """The experiment's QUEUED trials and why each waits, in the order they would start.

    Trials in the cluster's queue come first, in its order, with the scheduler's reason
    and how long they have waited there; then those without a queue row, by number
    (``"experiment paused"``, or ``"waiting for the next placement decision"`` until the
    driver's next tick queues them: their wait is not known). At most ``limit`` rows.
    """
    now = utcnow() if now is None else now
    queued = _T.c.experiment_id == experiment_id, _T.c.state == TrialState.QUEUED
    with engine.connect() as conn:
        experiment = conn.execute(
            sa.select(_E.c.state, _E.c.config).where(_E.c.id == experiment_id)
        ).first()
        if experiment is None:
            return Page(pd.DataFrame(columns=_WAITING_COLUMNS), 0, 0, limit)
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
        return Page(pd.DataFrame(columns=_WAITING_COLUMNS), 0, 0, limit)
    views = {view.trial_id: view for view in _queue_views(engine, experiment_id)}
    order = {trial_id: position for position, trial_id in enumerate(views)}
    state = _enum_value(experiment.state)
    # The driver queues its trials at the experiment's priority (``resources.priority``).
    config = typed_config(experiment.config)
    priority = (ResourcesConfig() if config is None else config.resources).priority
    rows = []
    for trial in sorted(
        trials, key=lambda t: (order.get(t.id, len(order)), t.optuna_trial_number)
    ):
        view = views.get(trial.id)
        waited = None if view is None else _waited_s(view, now)
        rows.append(
            {
                "id": trial.id,
                "trial": trial_label(experiment_id, trial.optuna_trial_number),
                "number": trial.optuna_trial_number,
                "slots": trial.slots_per_trial if view is None else view.slots,
                "priority": priority if view is None else view.priority,
                "waiting_s": waited,
                "waiting": None if waited is None else duration_words(waited),
                "reason": waiting_reason(view, state),
            }
        )
    return Page(pd.DataFrame(rows, columns=_WAITING_COLUMNS), int(total), 0, limit)


def _enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


# --- Analysis: learning curves, failures, comparisons ------------------------------------


@dataclasses.dataclass(frozen=True)
class LearningCurves:
    """The searcher metric of (a sample of) an experiment's trials against their step.

    ``points`` has one row per trial and step bucket: ``trial_id``, ``number``,
    ``state``, ``step``, ``epoch``, ``value``, ``best`` (the best completed trial),
    ``stopped`` (the last point of a pruned trial: where ASHA stopped it).
    """

    points: pd.DataFrame
    kind: str | None
    trials_total: int
    trials_shown: int
    stride: int
    best_number: int | None


_CURVE_COLUMNS = [
    "trial_id",
    "number",
    "state",
    "step",
    "epoch",
    "value",
    "best",
    "stopped",
    "hparams",
]


def hparams_text(hparams: dict[str, Any] | None, constant: Collection[str] = ()) -> str:
    """A trial's hyperparameters in one line for a tooltip, 4 significant digits each.

    Example:
        >>> hparams_text({"lr": 0.000133333, "opt": "sgd", "hidden": 64}, {"hidden"})
        'lr=0.0001333, opt=sgd'
    """
    return ", ".join(
        f"{name}={_format.number(value)}"
        for name, value in sorted((hparams or {}).items())
        if name not in constant
    )


def learning_curves(
    engine: Engine,
    experiment_id: int,
    metric: str,
    *,
    smaller_is_better: bool,
    max_trials: int = 200,
    max_points: int = 60,
    include: Sequence[int] = (),
    constant: Collection[str] = (),
) -> LearningCurves:
    """Every trial's ``metric`` by step, or every n-th trial's when there are more than
    ``max_trials`` (the best trial and the trial numbers in ``include`` always).

    Only trial rows come into Python; the metric rows are downsampled in SQL to about
    ``max_points`` buckets of steps per trial; each point carries the trial's
    hyperparameters as text (``hparams``, without the ``constant`` ones) for the
    tooltip. The metric is read from the validation
    rows when the trials validate it (the searcher metric usually is), else training.
    """
    with engine.connect() as conn:
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
            if _enum_value(t.state) == TrialState.COMPLETED.value
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
            pd.DataFrame(columns=_CURVE_COLUMNS), None, len(trials), 0, stride, None
        )
        if not shown:
            return empty
        ids = list(shown)
        kinds = {
            _enum_value(k)
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
        frame = _frame(
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
    frame["state"] = [_enum_value(shown[i].state) for i in frame["trial_id"]]
    frame["best"] = best is not None and frame["number"] == best.optuna_trial_number
    last = ~frame["trial_id"].duplicated(keep="last")
    frame["stopped"] = last & (frame["state"] == TrialState.PRUNED.value)
    frame["hparams"] = [hparams_text(shown[i].hparams, constant) for i in frame["trial_id"]]
    return LearningCurves(
        points=frame[_CURVE_COLUMNS],
        kind=kind.value,
        trials_total=len(trials),
        trials_shown=int(frame["trial_id"].nunique()),
        stride=stride,
        best_number=None if best is None else int(best.optuna_trial_number),
    )


@dataclasses.dataclass(frozen=True)
class FailureSummary:
    """How an experiment's trials failed: how many, and the commonest recorded reason."""

    failed: int
    completed: int
    reason: str | None
    reason_count: int

    @property
    def all_failed(self) -> bool:
        return self.failed > 0 and self.completed == 0


def failure_summary(engine: Engine, experiment_id: int) -> FailureSummary:
    """Failed trials of an experiment and their commonest error, grouped in SQL."""
    failed = _T.c.state == TrialState.ERROR
    with engine.connect() as conn:
        counts = conn.execute(
            sa.select(
                sa.func.sum(sa.case((failed, 1), else_=0)),
                sa.func.sum(sa.case((_T.c.state == TrialState.COMPLETED, 1), else_=0)),
            ).where(_T.c.experiment_id == experiment_id)
        ).one()
        commonest = conn.execute(
            sa.select(_T.c.error, sa.func.count().label("n"))
            .where(_T.c.experiment_id == experiment_id, failed, _T.c.error.is_not(None))
            .group_by(_T.c.error)
            .order_by(sa.func.count().desc(), _T.c.error)
            .limit(1)
        ).first()
    return FailureSummary(
        failed=int(counts[0] or 0),
        completed=int(counts[1] or 0),
        reason=None if commonest is None else str(commonest.error),
        reason_count=0 if commonest is None else int(commonest.n),
    )


# What the driver writes into the error of trials it ends when it stops the experiment
# (``searcher.driver.running`` and ``searcher.driver.control``), before the stop's reason.
_STOPPED_PREFIXES = ("experiment stopped before the trial ran: ", "experiment stopped: ")


def fail_fast_stop(
    engine: Engine, experiment_id: int, config: ExperimentConfig | None
) -> str | None:
    """Why the driver stopped the experiment early (``fail_fast_trials``), or None.

    The driver logs ``stopping the experiment: REASON (fail_fast_trials: N)`` and
    writes REASON into the error of the trials it ends then. When no trial was left to
    end, the rule is read back from the trials: the first N (by number) all failed
    with one error and none succeeded.
    """
    limit = 0 if config is None else config.fail_fast_trials
    with engine.connect() as conn:
        state = conn.execute(sa.select(_E.c.state).where(_E.c.id == experiment_id)).scalar()
        if _enum_value(state) != ExperimentState.ERROR.value or limit <= 0:
            return None
        trials = conn.execute(
            sa.select(_T.c.state, _T.c.error)
            .where(_T.c.experiment_id == experiment_id)
            .order_by(_T.c.optuna_trial_number)
        ).all()
    for trial in trials:
        for prefix in _STOPPED_PREFIXES:
            if (trial.error or "").startswith(prefix):
                return f"{trial.error.removeprefix(prefix)} (fail_fast_trials: {limit})"
    states = [_enum_value(t.state) for t in trials]
    first = trials[:limit]
    if (
        len(first) < limit
        or any(s in (TrialState.COMPLETED.value, TrialState.PRUNED.value) for s in states)
        or any(_enum_value(t.state) != TrialState.ERROR.value for t in first)
        or len({t.error for t in first}) != 1
    ):
        return None
    return (
        f"the first {limit} trials all failed with the same error and none succeeded: "
        f"{first[0].error} (fail_fast_trials: {limit})"
    )


def trials_by_ids(engine: Engine, trial_ids: Sequence[int]) -> pd.DataFrame:
    """The trials with the given ids (any experiment), with their experiment's name."""
    if not trial_ids:
        return _trial_rows([]).assign(experiment=[])
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(*_TRIAL_LIST_COLUMNS, _T.c.experiment_id, _E.c.name.label("experiment"))
            .join(_E, _E.c.id == _T.c.experiment_id)
            .where(_T.c.id.in_(list(trial_ids)))
            .order_by(_T.c.experiment_id, _T.c.optuna_trial_number)
        ).all()
        shares = {e: _share_of(conn, e) for e in {row.experiment_id for row in rows}}
    frame = _trial_rows(rows)
    if any(share < 1.0 for share in shares.values()):
        frame["slots"] = [row.slots_per_trial * shares[row.experiment_id] for row in rows]
    frame["experiment_id"] = [row.experiment_id for row in rows]
    frame["experiment"] = [row.experiment for row in rows]
    return frame


def trials_metric_curves(
    engine: Engine,
    trial_ids: Sequence[int],
    kind: MetricKind | str,
    *,
    max_points: int = 200,
) -> pd.DataFrame:
    """Every metric of ``kind`` for several trials, each curve downsampled in SQL.

    Columns: trial_id, name, step, value. For overlaying trials on the Compare page.
    """
    frames = [
        metric_curves(
            engine,
            trial_id,
            kind,
            list(names["name"][names["kind"] == MetricKind(kind).value]),
            max_points=max_points,
        ).assign(trial_id=trial_id)
        for trial_id in trial_ids
        for names in [metric_names(engine, trial_id)]
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["trial_id", "name", "step", "epoch", "value"])
    return pd.concat(frames, ignore_index=True)


def best_so_far(engine: Engine, experiment_id: int, *, smaller_is_better: bool) -> pd.DataFrame:
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
    with engine.connect() as conn:
        frame = _frame(
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


def failed_trial_log(engine: Engine, experiment_id: int, error: str) -> str | None:
    """The log path of the newest failed trial that recorded ``error``, if it has one."""
    with engine.connect() as conn:
        path = conn.execute(
            sa.select(_T.c.log_path)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.ERROR,
                _T.c.error == error,
                _T.c.log_path.is_not(None),
            )
            .order_by(_T.c.id.desc())
            .limit(1)
        ).scalar()
    return None if path is None else str(path)


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """What the first rank of a trial's latest failed run recorded."""

    attempt: int
    rank: int
    exception: str
    traceback: str

    @property
    def who(self) -> str:
        """``rank N``, or ``torchrun`` for a failure torchrun recorded itself."""
        return "torchrun" if self.rank == TrialFailure.TORCHRUN_RANK else f"rank {self.rank}"


def trial_failure(engine: Engine, trial_id: int) -> RankFailure | None:
    """The first recorded failure of the trial's latest run that has one, if any."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(_R.c.attempt, _F.c.rank, _F.c.exception_type, _F.c.message, _F.c.traceback)
            .join(_R, _R.c.id == _F.c.run_id)
            .where(_F.c.trial_id == trial_id)
            .order_by(_R.c.attempt.desc(), _F.c.recorded_at, _F.c.id)
            .limit(1)
        ).first()
    if row is None:
        return None
    return RankFailure(
        attempt=row.attempt,
        rank=row.rank,
        exception=f"{row.exception_type}: {row.message}",
        traceback=row.traceback,
    )


def failure_traceback(engine: Engine, experiment_id: int, error: str) -> str | None:
    """The traceback a rank recorded for the newest failed trial that recorded ``error``."""
    with engine.connect() as conn:
        text = conn.execute(
            sa.select(_F.c.traceback)
            .join(_T, _T.c.id == _F.c.trial_id)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.ERROR,
                _T.c.error == error,
            )
            .order_by(_F.c.trial_id.desc(), _F.c.rank)
            .limit(1)
        ).scalar()
    return None if not text else str(text)


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


def diagnosis_choices(engine: Engine, limit: int = 200) -> pd.DataFrame:
    """Stored diagnoses, newest first: id, name, verdict, experiment id, when."""
    with engine.connect() as conn:
        return _frame(
            conn.execute(
                sa.select(_D.c.id, _D.c.name, _D.c.verdict, _D.c.experiment_id, _D.c.created_at)
                .order_by(_D.c.id.desc())
                .limit(limit)
            )
        )


def diagnosis_report(engine: Engine, diagnosis_id: int) -> dict[str, Any] | None:
    """One diagnosis: its row's fields and ``report``, the ``slotsweep diagnose --json``
    document it stored."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(_D).where(_D.c.id == diagnosis_id)).mappings().first()
    return None if row is None else dict(row)
