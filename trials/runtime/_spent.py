"""What a trial had spent at a validation, read by rank 0 from the database.

Its compute (slot-seconds, counted as rungs in compute count it:
:mod:`trials.compute_spent`) is the step of a validation with ``pruner.resource:
slot_seconds``; with cost objectives (``searcher.objectives``) each cost spent by then
goes to the study's pruner with the metric, which ranks a rung's trials over all of them
(:mod:`trials.pruning`). Both come from the trial's rows, never from a process's clock,
so a restarted trial counts what its earlier runs spent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trials.compute_spent import RunSpan, slot_seconds_spent
from trials.config import RuntimeSpec

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def slot_seconds_so_far(session: Session, spec: RuntimeSpec, moment: float) -> float:
    """The trial's compute up to ``moment`` (a ``time.time()``), from its runs' spans."""
    from sqlalchemy import select

    from storage import TrialRun, utc_from_timestamp

    rows = session.execute(
        select(TrialRun.training_started_at, TrialRun.progress_at, TrialRun.ended_at).where(
            TrialRun.trial_id == spec.trial_id
        )
    ).all()
    spans = [RunSpan(start, progress, ended) for start, progress, ended in rows]
    return slot_seconds_spent(spans, spec.compute_slots, utc_from_timestamp(moment))


def costs_spent(
    session: Session, spec: RuntimeSpec, moment: float, slot_seconds: float | None = None
) -> list[float]:
    """What the trial had spent of each cost objective by ``moment``, in their order.

    ``slot_seconds``: its compute (``slot_seconds`` where already counted);
    ``wall_seconds``: the time since it first started, as the driver tells Optuna at
    its end. Empty without objectives.
    """
    from sqlalchemy import select

    from storage import Trial, utc_from_timestamp

    costs = []
    for objective in spec.objectives:
        if objective == "slot_seconds":
            if slot_seconds is None:
                slot_seconds = slot_seconds_so_far(session, spec, moment)
            costs.append(slot_seconds)
            continue
        started = session.scalar(select(Trial.started_at).where(Trial.id == spec.trial_id))
        wall = 0.0 if started is None else (utc_from_timestamp(moment) - started).total_seconds()
        costs.append(max(0.0, wall))
    return costs
