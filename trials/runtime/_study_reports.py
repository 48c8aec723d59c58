"""Rank 0's side of the Optuna study: its trial, the reports to it, the pruner's questions.

Used from the recorder's thread only (:class:`trials.runtime._recorder.ChiefRecorder`),
which imports Optuna there, lazily, so the other ranks never do.

A single-objective study gets each validation's metric as Optuna's intermediate value
(its pruner and its plots read them). A multi-objective study's pruner
(:mod:`trials.pruning`) reads only a trial's latest report, and only when asked, which
rank 0 does at a rung (:mod:`trials.runtime._prune_gate`): so the latest validation
waits, and it and what the trial had spent of each cost by then are written right before
the question, one Optuna write per rung instead of one per validation.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from trials import pruning
from trials.config import RuntimeSpec
from trials.runtime._spent import costs_spent

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

T = TypeVar("T")
#: Runs a body in one fenced transaction of the recorder (``ChiefRecorder._transaction``).
Transaction = Callable[[Callable[["Session"], T]], T]


@dataclass(frozen=True)
class _Pending:
    """A validation a multi-objective study's pruner has not been asked about yet."""

    value: float
    step: int
    moment: float
    #: The trial's compute at ``moment`` where counted (rungs in slot-seconds).
    slot_seconds: float | None


class StudyReports:
    """The trial's Optuna trial, loaded on first use, and what rank 0 tells and asks it."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._trial: Any = None
        self._pending: _Pending | None = None

    def report(
        self, value: float, step: int, moment: float, slot_seconds: float | None = None
    ) -> None:
        """The validation of ``moment`` at ``step``: written now (one objective), or kept
        for the next question (several). ``slot_seconds``: the compute at ``moment``,
        where already counted."""
        if self.spec.objectives:
            self._pending = _Pending(float(value), step, moment, slot_seconds)
            return
        from storage import retry_transient

        trial = retry_transient(self.trial)
        retry_transient(lambda: trial.report(float(value), step))

    def ask(self, transaction: Transaction[list[float]]) -> bool:
        """Whether the study's pruner stops the trial, after the pending report if any."""
        from storage import retry_transient

        trial = retry_transient(self.trial)
        pending, self._pending = self._pending, None
        if pending is not None:
            costs = transaction(
                lambda session: costs_spent(
                    session, self.spec, pending.moment, pending.slot_seconds
                )
            )
            values = [pending.value, *costs]
            retry_transient(lambda: pruning.report_objectives(trial, values, pending.step))
        return bool(retry_transient(lambda: pruning.should_prune(trial)))

    def trial(self) -> Any:
        """The ``optuna.trial.Trial`` of this trial, its study loaded with the pruner."""
        if self._trial is None:
            import optuna

            # A restart replays the steps after its checkpoint: Optuna keeps each step's
            # first value (it knows them from the trial it reads) and would warn in the
            # trial's log for every step told again.
            warnings.filterwarnings(
                "ignore", message="The reported value is ignored", category=UserWarning
            )

            from storage import optuna_storage

            study = optuna.load_study(
                study_name=self.spec.study_name,
                storage=optuna_storage(self.spec.db_url),
                pruner=pruning.build_pruner(self.spec.pruner),
            )
            self._trial = optuna.trial.Trial(study, self.spec.optuna_trial_id)
        return self._trial
