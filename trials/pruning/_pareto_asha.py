"""Multi-objective successive halving (MO-ASHA) and Hyperband as Optuna pruners.

Optuna prunes single-objective studies only (``Trial.report`` and
``Trial.should_prune`` raise in a multi-objective one; optuna/optuna#3450). These
pruners rank the trials at a rung over all the study's objectives: non-dominated
sorting, then crowding distance within a front (:mod:`trials.pruning._fronts` says
why), promoting the top ``1 / reduction_factor`` asynchronously, as Optuna's
``SuccessiveHalvingPruner`` does for one objective (and with one objective they make
its decisions exactly).

Everything goes through Optuna's public API, in any storage: a trial reports its values
with :func:`report_objectives` (a user attribute), asks with :func:`should_prune`
(Optuna's own ``Trial.should_prune`` in a single-objective study), and each rung
decision is recorded once, as a study user attribute (:mod:`trials.pruning._records`),
when the trial meets the rung. A recorded decision is final: a trial asked again at a
rung it passed (restarted from a checkpoint, its search resumed) keeps its promotion,
and one that was pruned there is pruned again at its first question, never promoted.

Example (plain Optuna; accuracy up, seconds of training down):
    >>> import optuna
    >>> from trials.pruning import ParetoSuccessiveHalvingPruner
    >>> from trials.pruning import report_objectives, should_prune
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> study = optuna.create_study(
    ...     directions=["maximize", "minimize"],
    ...     pruner=ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=2))
    >>> def objective(trial):
    ...     quality = trial.suggest_float("quality", 0.0, 1.0)
    ...     cost = trial.suggest_float("cost", 1.0, 10.0)
    ...     for epoch in range(1, 5):
    ...         values = [quality * epoch / 4, cost * epoch]
    ...         report_objectives(trial, values, step=epoch)
    ...         if should_prune(trial):
    ...             raise optuna.TrialPruned()
    ...     return values
    >>> for quality, cost in [(0.9, 5.0), (0.5, 9.0), (0.95, 8.0), (0.6, 1.0), (0.4, 6.0)]:
    ...     study.enqueue_trial({"quality": quality, "cost": cost})
    >>> study.optimize(objective, n_trials=5)
    >>> [trial.state.name for trial in study.trials]
    ['COMPLETE', 'PRUNED', 'COMPLETE', 'COMPLETE', 'PRUNED']
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.pruners import BasePruner
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from trials.config import PrunerSpec
from trials.pruning._fronts import Direction, promoted
from trials.pruning._records import (
    REPORT_KEY,
    Report,
    RungDecision,
    read_report,
    rung_decisions,
)


@dataclass(frozen=True)
class _Ladder:
    """The rungs of one successive halving: ``min_resource * factor ** (rate + rung)``."""

    min_resource: int
    reduction_factor: int
    rate: int

    def step(self, rung: int) -> int:
        return int(self.min_resource * self.reduction_factor ** (self.rate + rung))


class ParetoSuccessiveHalvingPruner(BasePruner):
    """Asynchronous successive halving over every objective of the study (MO-ASHA).

    A trial meets rung ``k`` when it reports a step of at least ``min_resource *
    reduction_factor ** (min_early_stopping_rate + k)``; it goes on when fewer than
    ``max(1, n // reduction_factor)`` of the ``n`` trials that met the rung so far
    (itself included) rank strictly ahead of it by front, then crowding distance, on
    the values each reported there. Otherwise it is pruned. A NaN value is pruned at
    once. The steps and ``min_resource`` are in whatever resource the trials report at
    (epochs, batches, compute). Unlike Optuna's, ``min_resource`` has no ``"auto"``.

    Example:
        >>> ParetoSuccessiveHalvingPruner(min_resource=2, reduction_factor=3).rung_steps(3)
        [2, 6, 18]
    """

    def __init__(
        self, min_resource: int = 1, reduction_factor: int = 3, min_early_stopping_rate: int = 0
    ) -> None:
        if min_resource < 1:
            raise ValueError(f"min_resource ({min_resource}) must be at least 1")
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor ({reduction_factor}) must be at least 2")
        if min_early_stopping_rate < 0:
            raise ValueError(
                f"min_early_stopping_rate ({min_early_stopping_rate}) must be at least 0"
            )
        self._ladder = _Ladder(min_resource, reduction_factor, min_early_stopping_rate)

    def rung_steps(self, count: int) -> list[int]:
        """The steps of the first ``count`` rungs."""
        return [self._ladder.step(rung) for rung in range(count)]

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        """Whether ``trial`` stops at its latest report; records a rung it met."""
        return _judge(study, trial, self._ladder, lambda number: True)


class ParetoHyperbandPruner(BasePruner):
    """Hyperband over several objectives: brackets of :class:`ParetoSuccessiveHalvingPruner`.

    As Optuna's ``HyperbandPruner``: ``floor(log_factor(max_resource / min_resource)) + 1``
    brackets, bracket ``s`` a successive halving with ``min_early_stopping_rate = s``,
    each trial in one bracket (a hash of the study's name and its number, weighted by
    the bracket's share of trials) and ranked against its bracket's trials only.

    Example:
        >>> pruner = ParetoHyperbandPruner(min_resource=1, max_resource=27)
        >>> pruner.brackets, sorted({pruner.bracket("demo", number) for number in range(50)})
        (4, [0, 1, 2, 3])
    """

    def __init__(self, min_resource: int, max_resource: int, reduction_factor: int = 3) -> None:
        if min_resource < 1:
            raise ValueError(f"min_resource ({min_resource}) must be at least 1")
        if max_resource <= min_resource:
            raise ValueError(
                f"max_resource ({max_resource}) must be more than min_resource ({min_resource})"
            )
        if reduction_factor < 2:
            raise ValueError(f"reduction_factor ({reduction_factor}) must be at least 2")
        self._min_resource = min_resource
        self._reduction_factor = reduction_factor
        self.brackets = (
            math.floor(math.log(max_resource / min_resource, reduction_factor) + 1e-9) + 1
        )
        # Bracket s's share of trials, as Hyperband's n_s (Li et al., Algorithm 1).
        self._shares = [
            math.ceil(
                self.brackets * reduction_factor ** (self.brackets - 1 - s) / (self.brackets - s)
            )
            for s in range(self.brackets)
        ]

    def bracket(self, study_name: str, trial_number: int) -> int:
        """The bracket of trial ``trial_number`` of study ``study_name``."""
        draw = binascii.crc32(f"{study_name}_{trial_number}".encode()) % sum(self._shares)
        for bracket, share in enumerate(self._shares):
            draw -= share
            if draw < 0:
                return bracket
        raise AssertionError("unreachable: the draw is below the shares' sum")

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        """Whether ``trial`` stops at its latest report, ranked within its bracket."""
        bracket = self.bracket(study.study_name, trial.number)
        ladder = _Ladder(self._min_resource, self._reduction_factor, bracket)
        return _judge(
            study,
            trial,
            ladder,
            lambda number: self.bracket(study.study_name, number) == bracket,
        )


def report_objectives(trial: optuna.trial.Trial, values: Sequence[float], step: int) -> None:
    """``Trial.report`` for any number of objectives: the values at ``step``, in order.

    One value per objective of the study, in its directions' order. Each report
    replaces the last (the pruners read the latest; a rung keeps what the trial had
    there).

    Example:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(directions=["maximize", "minimize"])
        >>> trial = study.ask()
        >>> report_objectives(trial, [0.9, 12.0], step=3)
        >>> trial.user_attrs["intermediate_objectives"]
        {'step': 3, 'values': [0.9, 12.0]}
        >>> report_objectives(trial, [0.9], step=4)
        Traceback (most recent call last):
        ...
        ValueError: report_objectives: 1 values for a study of 2 objectives
    """
    objectives = len(trial.study.directions)
    if len(values) != objectives:
        raise ValueError(
            f"report_objectives: {len(values)} values for a study of {objectives} objectives"
        )
    if int(step) != step or step < 0:
        raise ValueError(f"report_objectives: step ({step}) must be a whole number >= 0")
    report = Report(int(step), tuple(float(value) for value in values))
    trial.set_user_attr(REPORT_KEY, report.to_json())


def should_prune(trial: optuna.trial.Trial) -> bool:
    """``Trial.should_prune`` for any number of objectives: asks the study's pruner.

    A single-objective study asks as ``trial.should_prune()`` does. A multi-objective
    one passes the trial (with the values of :func:`report_objectives`) to the study's
    pruner, which must be one of this module's or Optuna's ``NopPruner``: Optuna's own
    pruners read a single direction.
    """
    study = trial.study
    if len(study.directions) == 1:
        return trial.should_prune()
    pruner = study.pruner
    if isinstance(pruner, optuna.pruners.NopPruner):
        return False
    if not isinstance(pruner, ParetoSuccessiveHalvingPruner | ParetoHyperbandPruner):
        raise TypeError(
            f"should_prune: a multi-objective study needs a ParetoSuccessiveHalvingPruner "
            f"or ParetoHyperbandPruner, not {type(pruner).__name__}"
        )
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    frozen = next((each for each in running if each.number == trial.number), None)
    return frozen is not None and pruner.prune(study, frozen)


def _latest(study: Study, trial: FrozenTrial) -> Report | None:
    """The trial's latest report: its own, or a single-objective study's intermediate value."""
    report = read_report(trial.user_attrs)
    if report is not None or len(study.directions) > 1 or trial.last_step is None:
        return report
    return Report(trial.last_step, (trial.intermediate_values[trial.last_step],))


def _judge(
    study: Study,
    trial: FrozenTrial,
    ladder: _Ladder,
    competes: Callable[[int], bool],
) -> bool:
    """Decide ``trial`` at the rungs its latest report reached; record each decision.

    ``competes(number)``: whether trial ``number``'s decisions rank against this one's
    (Hyperband: the same bracket).
    """
    report = _latest(study, trial)
    if report is None:
        return False
    recorded = rung_decisions(study.user_attrs)
    own = {decision.rung: decision for decision in recorded.get(trial.number, [])}
    rung = 0
    while rung in own:
        if not own[rung].promoted:
            return True  # decided before (a restarted trial): pruned stays pruned
        rung += 1
    directions: list[Direction] = [
        "maximize" if direction == StudyDirection.MAXIMIZE else "minimize"
        for direction in study.directions
    ]
    while report.step >= ladder.step(rung):
        decision = _decide(trial.number, rung, report, recorded, directions, ladder, competes)
        study.set_user_attr(decision.key, decision.to_json())
        if not decision.promoted:
            return True
        rung += 1
    return False


def _decide(
    number: int,
    rung: int,
    report: Report,
    recorded: dict[int, list[RungDecision]],
    directions: list[Direction],
    ladder: _Ladder,
    competes: Callable[[int], bool],
) -> RungDecision:
    """Trial ``number``'s decision at ``rung`` against the decisions recorded there."""
    decision = RungDecision(number, rung, report.step, report.values, promoted=False)
    if not decision.comparable:
        return decision
    others = [
        each.values
        for other, decisions in recorded.items()
        if other != number and competes(other)
        for each in decisions
        if each.rung == rung and each.comparable
    ]
    points = [*others, report.values]
    verdict = promoted(points, directions, len(others), ladder.reduction_factor)
    return RungDecision(number, rung, report.step, report.values, promoted=verdict)


#: The pruners of this module by class name, as a :class:`trials.config.PrunerSpec` names them.
PARETO_PRUNERS: dict[str, type[BasePruner]] = {
    "ParetoSuccessiveHalvingPruner": ParetoSuccessiveHalvingPruner,
    "ParetoHyperbandPruner": ParetoHyperbandPruner,
}


def build_pruner(spec: PrunerSpec | None) -> BasePruner:
    """The pruner ``spec`` names: one of this module's, else ``optuna.pruners``'; ``NopPruner``
    for None.

    Optuna does not store a study's pruner, so the driver and every trial's rank 0 build
    it from the spec the experiment's config gives.

    Example:
        >>> spec = PrunerSpec(name="ParetoHyperbandPruner",
        ...                   kwargs={"min_resource": 1, "max_resource": 9})
        >>> type(build_pruner(spec)).__name__, type(build_pruner(None)).__name__
        ('ParetoHyperbandPruner', 'NopPruner')
    """
    if spec is None:
        return optuna.pruners.NopPruner()
    kind = PARETO_PRUNERS.get(spec.name) or getattr(optuna.pruners, spec.name)
    pruner: BasePruner = kind(**spec.kwargs)
    return pruner
