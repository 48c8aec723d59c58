"""What the driver's tick decides about ended attempts, as plain data between its stages.

Reaping ends attempts; :class:`searcher.driver.outcomes.Outcomes` records each one's outcome
on the trial's row and returns what else must happen: the trial goes back to the
pending queue (:class:`Requeue`), or the whole experiment stops (:class:`StopExperiment`,
``fail_fast_trials``). A failed trial needs nothing more: its row and Optuna's FAIL are
written where it failed. The driver applies the decisions (:func:`apply_decisions`), so
no stage reaches back into another.

Example:
    >>> from searcher.driver.control import Control
    >>> class Queue:
    ...     def requeue(self, trial_id: int, slots: int) -> None:
    ...         print("queued", trial_id, slots)
    >>> control = Control()
    >>> apply_decisions([Requeue(trial_id=3, slots=2), StopExperiment("all failed")], Queue(), control)
    queued 3 2
    >>> control.action.value, control.stop_reason
    ('error', 'all failed')
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from searcher.driver.control import Control, Stop


@dataclass(frozen=True)
class Requeue:
    """The trial goes back to the pending queue: restarted, or stopped by the cluster."""

    trial_id: int
    #: The trial's ``slots_per_trial``.
    slots: int


@dataclass(frozen=True)
class StopExperiment:
    """The experiment stops (ERROR): its first trials all failed the same way."""

    reason: str


#: One thing the driver does about an ended attempt beyond the trial's own row.
Decision = Requeue | StopExperiment


class RequeueTarget(Protocol):
    """Where requeued trials wait (:class:`searcher.driver.placement.PendingQueue`)."""

    def requeue(self, trial_id: int, slots: int) -> None:
        """Queue the trial again (once)."""


def apply_decisions(
    decisions: Iterable[Decision], pending: RequeueTarget, control: Control
) -> None:
    """Queue the requeued trials in ``pending``; a stop becomes ``control``'s action."""
    for decision in decisions:
        if isinstance(decision, Requeue):
            pending.requeue(decision.trial_id, decision.slots)
        else:
            control.action = Stop.ERROR
            control.stop_reason = decision.reason
