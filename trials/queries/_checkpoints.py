"""A trial's checkpoints and its runs (each launch, restarts included): the API's
``checkpoint_path``, ``slotsweep describe``'s checkpoint column, the Trial page.

A trial's newest checkpoint is its completed checkpoint of the highest step, as a
restart picks it (:func:`newest_checkpoint_path`, :func:`newest_checkpoint_steps`).

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> newest_checkpoint_steps(engine, 1), newest_checkpoint_path(engine, 1)
    ({}, None)
    >>> damaged_checkpoints(engine, 1)
    {}
    >>> trial_runs(engine, 1).empty
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from storage import Checkpoint, CheckpointState, Trial, TrialRun
from trials.queries._reading import Source, enum_value, frame_of, reading

if TYPE_CHECKING:
    import pandas as pd

_T = Trial.__table__
_R = TrialRun.__table__
_C = Checkpoint.__table__


def newest_checkpoint_path(db: Source, trial_id: int) -> str | None:
    """Where the trial's newest completed checkpoint is (a folder or a URL); None if none."""
    with reading(db) as conn:
        path = conn.execute(
            sa.select(_C.c.path)
            .where(_C.c.trial_id == trial_id, _C.c.state == CheckpointState.COMPLETED)
            .order_by(_C.c.step.desc(), _C.c.id.desc())
            .limit(1)
        ).scalar()
    return None if path is None else str(path)


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A checkpoint a restore found damaged and skipped (CORRUPTED), kept for inspection."""

    uuid: str
    step: int
    #: Its folder or URL, where it was left as it was found.
    path: str
    #: Why it failed verification or loading (None where nothing was recorded).
    problem: str | None


def damaged_checkpoints(db: Source, experiment_id: int) -> dict[int, list[DamagedCheckpoint]]:
    """The experiment's damaged checkpoints by trial id, newest step first (what
    ``describe`` and the Trial page say a restore skipped and why)."""
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(_C.c.trial_id, _C.c.uuid, _C.c.step, _C.c.path, _C.c.problem)
            .join(_T, _T.c.id == _C.c.trial_id)
            .where(_T.c.experiment_id == experiment_id, _C.c.state == CheckpointState.CORRUPTED)
            .order_by(_C.c.step.desc(), _C.c.id.desc())
        ).all()
    found: dict[int, list[DamagedCheckpoint]] = {}
    for row in rows:
        found.setdefault(int(row.trial_id), []).append(
            DamagedCheckpoint(uuid=row.uuid, step=row.step, path=row.path, problem=row.problem)
        )
    return found


def newest_checkpoint_steps(db: Source, experiment_id: int) -> dict[int, int]:
    """The step of each trial's newest completed checkpoint, by trial id (trials of the
    experiment without one are absent)."""
    with reading(db) as conn:
        rows = conn.execute(
            sa.select(_C.c.trial_id, sa.func.max(_C.c.step))
            .join(_T, _T.c.id == _C.c.trial_id)
            .where(_T.c.experiment_id == experiment_id, _C.c.state == CheckpointState.COMPLETED)
            .group_by(_C.c.trial_id)
        ).all()
    return {int(trial_id): int(step) for trial_id, step in rows}


def checkpoints(db: Source, trial_id: int, *, limit: int = 100) -> pd.DataFrame:
    """A trial's checkpoints, newest step first; ``problem`` says why one is CORRUPTED."""
    with reading(db) as conn:
        frame = frame_of(
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
                    _C.c.problem,
                )
                .where(_C.c.trial_id == trial_id)
                .order_by(_C.c.step.desc())
                .limit(limit)
            )
        )
    if not frame.empty:
        frame["state"] = frame["state"].map(enum_value)
    return frame


def trial_runs(db: Source, trial_id: int, *, limit: int = 100) -> pd.DataFrame:
    """Every launch of a trial (attempt 0 is the first run, each restart adds one)."""
    with reading(db) as conn:
        frame = frame_of(
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
