"""Who holds the cluster's slots: ``slotsweep task list`` and ``agents``, the Cluster page.

The slot ledger (:mod:`trials.coordination.allocations`) owns what a holder is; these
are its reads for people: every slot and its holder (:func:`slot_holders`), slots in use
per agent (:func:`slots_in_use`), the UI's pages of allocations and a pool's slot map.
A warm job's slot carries the job and its state; while the job is idle or ending no
trial holds it (the ledger row keeps the last trial the job ran, which is over). A slot
that trials share (``resources.slots_per_trial`` 0.5, 0.25, 0.125) has one holder per
share; what a holder has of its slot is its ``share``, and slots in use count a share at
its fraction.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> slot_holders(engine), slots_in_use(engine), allocations(engine).total
    ([], {}, 0)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from storage import Allocation, Experiment, Trial, WarmJob
from trials.config import EIGHTHS_PER_SLOT, slot_share_of
from trials.coordination.allocations import (
    WARM_RESERVED,
    WARM_RUNNING,
    SlotHolder,
    holders,
    trial_holds,
    warm_state_column,
)
from trials.queries._reading import Page, Source, enum_value, frame_of, orm_session, reading

if TYPE_CHECKING:
    import pandas as pd

    from trials.scheduler import Cluster

_E = Experiment.__table__
_T = Trial.__table__
_A = Allocation.__table__
_W = WarmJob.__table__


def slot_holders(
    db: Source, cluster: Cluster | None = None, now: _dt.datetime | None = None
) -> list[SlotHolder]:
    """Every slot and its holder (with ``cluster``, its free slots too), for ``task list``.

    The ledger's own read (:func:`trials.coordination.allocations.holders`), from any
    :data:`~trials.queries.Source`.
    """
    with orm_session(db) as session:
        return holders(session, cluster, now)


@dataclasses.dataclass(frozen=True)
class SlotsInUse:
    """What one agent's slots hold now: slots in use (a share at its fraction), how many
    slots trials share, and what is free of those (a fraction of a slot)."""

    held: float = 0.0
    shared: int = 0
    room: float = 0.0


def slots_in_use(db: Source) -> dict[tuple[str, str], SlotsInUse]:
    """Slots held per (pool, agent) right now: by a trial or a warm job, idle or not, a
    share at its fraction; a slot whose lease ran out (its driver stopped renewing) is
    not counted."""
    return in_use(slot_holders(db))


def in_use(holders: Sequence[SlotHolder]) -> dict[tuple[str, str], SlotsInUse]:
    """:func:`slots_in_use` of the ledger's ``holders`` (stale claims left out).

    Example:
        >>> use = in_use([SlotHolder("p", "a", "h", 0, 1, 1, eighths=2),
        ...               SlotHolder("p", "a", "h", 0, 1, 2, eighths=4),
        ...               SlotHolder("p", "a", "h", 1, 1, 3)])
        >>> use[("p", "a")]
        SlotsInUse(held=1.75, shared=1, room=0.25)
    """
    held: dict[tuple[str, str], float] = {}
    shares: dict[tuple[str, str, int], float] = {}
    for h in holders:
        if not h.held or h.stale:
            continue
        key = (h.pool, h.agent)
        held[key] = held.get(key, 0.0) + slot_share_of(h.eighths)
        if h.eighths < EIGHTHS_PER_SLOT:
            slot = (h.pool, h.agent, h.slot)
            shares[slot] = shares.get(slot, 0.0) + slot_share_of(h.eighths)
    use = {key: SlotsInUse(held=value) for key, value in held.items()}
    for (pool, agent, _), used in shares.items():
        was = use[(pool, agent)]
        use[(pool, agent)] = SlotsInUse(was.held, was.shared + 1, was.room + 1.0 - used)
    return use


def _share() -> sa.ColumnElement[Any]:
    # What a ledger row holds of its slot, as a fraction (exact: eighths over 8).
    return (_A.c.eighths / sa.literal(float(EIGHTHS_PER_SLOT))).label("share")


def _warm_state() -> sa.ColumnElement[Any]:
    # What a warm job does with the slot (``trials.coordination.allocations.SlotHolder.warm_state``);
    # the query outer-joins ``_W`` on the row's ``warm_job_id``.
    return warm_state_column().label("warm_state")


def _trial_holds(state: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    # An idle or ending warm job's row keeps the last trial it ran, which is over.
    return sa.or_(state.is_(None), state.in_([WARM_RUNNING, WARM_RESERVED]))


def _without_finished_trials(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Blank the trial of the rows an idle or ending warm job holds (its last trial is over)."""
    import pandas as pd

    if frame.empty:
        return frame
    idle = [not trial_holds(None if pd.isna(state) else state) for state in frame["warm_state"]]
    if not any(idle):
        return frame
    frame = frame.astype({column: object for column in columns})
    frame.loc[idle, list(columns)] = None
    return frame


def allocations(db: Source, *, limit: int = 500, offset: int = 0) -> Page:
    """Held slots with the trial and experiment holding each.

    A warm job's slots carry the job (``warm_job_id``, ``warm_state``); while the job
    is idle or ending no trial holds them (``trial_id`` and the trial's columns are None).
    """
    with reading(db) as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(_A)).scalar_one()
        frame = frame_of(
            conn.execute(
                sa.select(
                    _A.c.resource_pool.label("pool"),
                    _A.c.agent,
                    _A.c.host,
                    _A.c.slot,
                    _share(),
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
        frame["trial_state"] = frame["trial_state"].map(enum_value)
        frame = _without_finished_trials(frame, ["trial_id", "trial_number", "trial_state"])
    return Page(frame, int(total), offset, limit)


def allocation_summary(db: Source) -> pd.DataFrame:
    """Per pool and agent: slots held (a share at its fraction), trials and warm jobs
    holding them, the oldest allocation. An idle warm job's slots count for the job, not
    for its last trial."""
    state = warm_state_column()
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(
                    _A.c.resource_pool.label("pool"),
                    _A.c.agent,
                    _A.c.host,
                    (sa.func.sum(_A.c.eighths) / sa.literal(float(EIGHTHS_PER_SLOT))).label(
                        "slots_held"
                    ),
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
    db: Source, pool: str, agents: Sequence[str]
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
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(
                _A.c.agent,
                _A.c.slot,
                _share(),
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
            holder = {**row, "trial_state": enum_value(row["trial_state"])}
            if not trial_holds(row["warm_state"]):
                holder.update(trial_id=None, optuna_trial_number=None, trial_state=None)
            held.setdefault((row["agent"], int(row["slot"])), []).append(holder)
        return held
