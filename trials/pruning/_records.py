"""What multi-objective pruning stores in an Optuna study, and how to read it back.

Optuna's ``Trial.report`` refuses multi-objective studies, and intermediate values
written into one any other way break Optuna's TPE (a pruned trial with intermediate
values makes its next ``ask`` fail on ``study.direction``). So the pruner's data lives in
user attributes, which Optuna's public API writes in any study:

- a trial's latest report, ``trial.user_attrs["intermediate_objectives"]``:
  ``{"step": 3, "values": [0.91, 12.5]}``, one value per objective in the study's order
  (:func:`trials.pruning.report_objectives` writes it);
- each rung decision, ``study.user_attrs["pareto_rung:<trial number>:<rung>"]``:
  ``{"step": 3, "values": [...], "promoted": true}``, written once by the pruner when
  the trial reached the rung; the values are the trial's at that step. On the study, so
  that the pruner records them from Optuna's own ``prune(study, trial)`` call, and one
  read gives every trial's decisions (the UI's pruned trials and where they stopped).

Plain functions of those mappings, no Optuna: the UI and ``slotsweep describe`` read them
too.

Example:
    >>> attrs = {"pareto_rung:4:0": {"step": 1, "values": [0.8, 2.0], "promoted": True},
    ...          "pareto_rung:4:1": {"step": 3, "values": [0.85, 6.1], "promoted": False},
    ...          "pareto_rung:5:0": {"step": 1, "values": [0.9, 1.5], "promoted": True}}
    >>> decisions = rung_decisions(attrs)
    >>> [(d.trial_number, d.rung, d.promoted) for d in decisions[4]]
    [(4, 0, True), (4, 1, False)]
    >>> stopped_at(decisions[4])
    RungDecision(trial_number=4, rung=1, step=3, values=(0.85, 6.1), promoted=False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trials.config import STEPS_PER_SLOT_SECOND
from trials.numbers import format_value

#: The trial user attribute holding its latest report.
REPORT_KEY = "intermediate_objectives"
#: The study user attributes holding rung decisions: ``pareto_rung:<number>:<rung>``.
RUNG_KEY_PREFIX = "pareto_rung:"


@dataclass(frozen=True)
class Report:
    """A trial's objective values at ``step`` (in the pruner's resource unit)."""

    step: int
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        """The attribute's value."""
        return {"step": self.step, "values": list(self.values)}


@dataclass(frozen=True)
class RungDecision:
    """A trial met rung ``rung`` at ``step`` with ``values``, and went on or was pruned."""

    trial_number: int
    rung: int
    step: int
    values: tuple[float, ...]
    promoted: bool

    @property
    def key(self) -> str:
        """The study user attribute it is stored under."""
        return rung_key(self.trial_number, self.rung)

    @property
    def comparable(self) -> bool:
        """Whether it ranks against others (a NaN value is pruned at once, unranked)."""
        return not any(math.isnan(value) for value in self.values)

    def to_json(self) -> dict[str, Any]:
        """The attribute's value."""
        return {"step": self.step, "values": list(self.values), "promoted": self.promoted}


def rung_key(trial_number: int, rung: int) -> str:
    """The study user attribute of a trial's decision at a rung.

    Example:
        >>> rung_key(12, 0)
        'pareto_rung:12:0'
    """
    return f"{RUNG_KEY_PREFIX}{trial_number}:{rung}"


def how_far(step: int, unit: str) -> str:
    """How far a trial had come at ``step`` of the pruner's resource ``unit``, in words.

    Steps in slot-seconds are Optuna's integer hundredths of a slot-second.

    Example:
        >>> how_far(3, "epochs"), how_far(300, "batches"), how_far(250, "slot_seconds")
        ('epoch 3', 'batch 300', '2.5 slot-seconds')
    """
    if unit == "slot_seconds":
        return f"{format_value(step / STEPS_PER_SLOT_SECOND)} slot-seconds"
    return f"{_SINGULAR[unit]} {step}"


_SINGULAR = {"epochs": "epoch", "batches": "batch"}


def read_report(user_attrs: Mapping[str, Any]) -> Report | None:
    """A trial's latest report from its user attributes (None: nothing reported).

    Example:
        >>> read_report({"intermediate_objectives": {"step": 2, "values": [0.5, 7]}})
        Report(step=2, values=(0.5, 7.0))
    """
    stored = user_attrs.get(REPORT_KEY)
    if not isinstance(stored, Mapping):
        return None
    return Report(int(stored["step"]), _floats(stored["values"]))


def rung_decisions(study_user_attrs: Mapping[str, Any]) -> dict[int, list[RungDecision]]:
    """Every trial's rung decisions, by trial number, each list in rung order."""
    found: dict[int, list[RungDecision]] = {}
    for key, stored in study_user_attrs.items():
        if not key.startswith(RUNG_KEY_PREFIX) or not isinstance(stored, Mapping):
            continue
        number, _, rung = key[len(RUNG_KEY_PREFIX) :].partition(":")
        found.setdefault(int(number), []).append(
            RungDecision(
                trial_number=int(number),
                rung=int(rung),
                step=int(stored["step"]),
                values=_floats(stored["values"]),
                promoted=bool(stored["promoted"]),
            )
        )
    for decisions in found.values():
        decisions.sort(key=lambda decision: decision.rung)
    return found


def stopped_at(decisions: Sequence[RungDecision]) -> RungDecision | None:
    """The decision that pruned a trial: its first rung not promoted (None: none did)."""
    return next((decision for decision in decisions if not decision.promoted), None)


def _floats(values: Sequence[Any]) -> tuple[float, ...]:
    return tuple(float(value) for value in values)
