"""A multi-objective study's Pareto front so far and where its pruned trials stopped, read
from the database for ``slotsweep describe`` and the UI's experiment page.

Through ``storage.studies``, the one gateway to Optuna's data (its public storage API);
Optuna itself is imported only when a study has several objectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trials.pruning import RungDecision, pareto_front, rung_decisions, stopped_at

if TYPE_CHECKING:
    from trials.config import SearcherConfig


@dataclass(frozen=True)
class ParetoSummary:
    """The front and the stops of one multi-objective search, in its objectives' order."""

    #: The searcher metric, then each cost objective.
    objectives: list[str]
    #: (trial number, values Optuna was told) of each completed trial on the front, the
    #: best searcher metric first.
    front: list[tuple[int, tuple[float, ...]]]
    #: The decision that pruned each trial the pruner stopped, by trial number.
    stops: list[RungDecision]


def pareto_summary(db_url: str, study_name: str, searcher: SearcherConfig) -> ParetoSummary:
    """The search's front and stops; both empty for a single-objective search."""
    if not searcher.objectives:
        return ParetoSummary([searcher.metric], [], [])
    import optuna

    from storage import study_trials

    completed = [
        (trial.number, tuple(trial.values))
        for trial in study_trials(db_url, study_name, states=(optuna.trial.TrialState.COMPLETE,))
        or []
        if trial.values is not None
    ]
    on_front = pareto_front([values for _, values in completed], searcher.directions)
    sign = 1.0 if searcher.smaller_is_better else -1.0
    front = sorted(
        (completed[index] for index in on_front), key=lambda item: (sign * item[1][0], item[0])
    )
    return ParetoSummary(searcher.objective_names, front, pruned_stops(db_url, study_name))


def pruned_stops(db_url: str, study_name: str) -> list[RungDecision]:
    """Where each trial the pruner stopped stopped: the rung decision that pruned it, by
    trial number (none in a study without multi-objective pruning).

    One read of the study's user attributes, whatever its number of trials.
    """
    from storage import study_user_attrs

    decisions = rung_decisions(study_user_attrs(db_url, study_name))
    stops = [stopped_at(decisions[number]) for number in sorted(decisions)]
    return [stop for stop in stops if stop is not None]
