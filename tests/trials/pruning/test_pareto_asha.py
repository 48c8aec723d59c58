"""The multi-objective pruners on real Optuna studies (in memory, and SQLite where storage
matters): the same decisions as Optuna's own pruners with one objective, the fronts at
hand-written rungs, recorded decisions kept when a trial is asked again, Hyperband's
brackets, and what the samplers see afterwards."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from trials.config import PrunerSpec
from trials.pruning import (
    ParetoHyperbandPruner,
    ParetoSuccessiveHalvingPruner,
    build_pruner,
    report_objectives,
    rung_decisions,
    should_prune,
    stopped_at,
)

MAX_MIN = ["maximize", "minimize"]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _curves(seed: int, trials: int, steps: int) -> list[list[float]]:
    rng = random.Random(seed)
    curves = []
    for _ in range(trials):
        level, noise = rng.random(), rng.random() * 0.1
        # Ties on purpose: values on a coarse grid, as a small validation set's accuracy.
        curves.append(
            [round(level * (1 - 0.5**step) + rng.random() * noise, 1) for step in range(steps)]
        )
    return curves


def _pruned_steps(
    study: optuna.Study,
    curves: list[list[float]],
    report: Callable[[optuna.trial.Trial, float, int], None],
    ask: Callable[[optuna.trial.Trial], bool],
) -> list[int]:
    """Each curve run as a trial, one after another: the step it was pruned at (0: never)."""
    pruned = []
    for curve in curves:
        trial = study.ask()
        stop = 0
        for step, value in enumerate(curve, start=1):
            report(trial, value, step)
            if ask(trial):
                stop = step
                break
        pruned.append(stop)
        if stop:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, curve[-1])
    return pruned


def _optuna_reports(trial: optuna.trial.Trial, value: float, step: int) -> None:
    trial.report(value, step)


def _our_reports(trial: optuna.trial.Trial, value: float, step: int) -> None:
    report_objectives(trial, [value], step)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("direction", ["minimize", "maximize"])
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda: ParetoSuccessiveHalvingPruner(1, 3),
            lambda: optuna.pruners.SuccessiveHalvingPruner(1, 3),
        ),
        (
            lambda: ParetoSuccessiveHalvingPruner(2, 2, min_early_stopping_rate=1),
            lambda: optuna.pruners.SuccessiveHalvingPruner(2, 2, min_early_stopping_rate=1),
        ),
        (
            lambda: ParetoHyperbandPruner(1, 27, 3),
            lambda: optuna.pruners.HyperbandPruner(1, 27, 3),
        ),
    ],
    ids=["asha", "asha-rate1", "hyperband"],
)
def test_one_objective_makes_optunas_decisions(
    seed: int,
    direction: str,
    ours: Callable[[], optuna.pruners.BasePruner],
    theirs: Callable[[], optuna.pruners.BasePruner],
) -> None:
    curves = _curves(seed, trials=40, steps=27)
    reference = optuna.create_study(study_name="same", direction=direction, pruner=theirs())
    expected = _pruned_steps(reference, curves, _optuna_reports, lambda t: t.should_prune())
    assert any(expected) and not all(expected)
    # Through Optuna's own report/should_prune, and through this module's.
    for report in (_optuna_reports, _our_reports):
        study = optuna.create_study(study_name="same", direction=direction, pruner=ours())
        assert _pruned_steps(study, curves, report, should_prune) == expected


def _mo_study(
    pruner: optuna.pruners.BasePruner, storage: optuna.storages.BaseStorage | None = None
) -> optuna.Study:
    return optuna.create_study(directions=MAX_MIN, pruner=pruner, storage=storage)


def _meet(study: optuna.Study, values: list[float], step: int = 1) -> tuple[int, bool]:
    """A new trial reports ``values`` at ``step`` and asks: its number and whether pruned."""
    trial = study.ask()
    report_objectives(trial, values, step)
    return trial.number, should_prune(trial)


def test_a_rung_ranks_by_front_then_crowding_and_records_each_decision() -> None:
    # Rungs at 1, 3, 9; a quarter of each rung goes on (reduction factor 4).
    study = _mo_study(ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=4))
    at_rung = [
        [0.80, 10.0],  # alone: goes on
        [0.70, 12.0],  # dominated by #0: 1 of 2 goes on, it is behind
        [0.90, 20.0],  # a new extreme of the front (most accurate)
        [0.60, 5.0],  # a new extreme (cheapest)
        [0.75, 11.0],  # dominated by #0 (and 4 // 4 = 1 place)
        [0.85, 15.0],  # on the front, but between #0 and #2: crowded
        [0.50, 30.0],  # dominated by everything
        [0.95, 40.0],  # the most accurate yet
    ]
    decisions = [_meet(study, values)[1] for values in at_rung]
    assert decisions == [False, True, False, False, True, True, True, False]
    recorded = rung_decisions(study.user_attrs)
    assert sorted(recorded) == list(range(8))
    assert [recorded[n][0].promoted for n in range(8)] == [not d for d in decisions]
    stop = stopped_at(recorded[5])
    assert len(recorded[5]) == 1 and stop is not None
    assert (stop.rung, stop.step, stop.values) == (0, 1, (0.85, 15.0))


def test_a_trial_goes_rung_by_rung_and_stops_where_it_falls_behind() -> None:
    study = _mo_study(ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=2))
    leader = study.ask()
    for step, values in ((1, [0.5, 1.0]), (2, [0.7, 2.0]), (3, [0.8, 3.0])):
        report_objectives(leader, values, step)
        assert not should_prune(leader)
    study.tell(leader, [0.8, 3.0])
    # Better at rung 0 (step 1), worse in both at rung 1 (step 2): stops there.
    follower = study.ask()
    report_objectives(follower, [0.6, 0.9], 1)
    assert not should_prune(follower)
    report_objectives(follower, [0.65, 2.5], 2)
    assert should_prune(follower)
    decisions = rung_decisions(study.user_attrs)[follower.number]
    assert [(d.rung, d.step, d.promoted) for d in decisions] == [(0, 1, True), (1, 2, False)]
    # Between rungs the pruner has nothing to decide.
    third = study.ask()
    report_objectives(third, [0.1, 9.0], 0)
    assert not should_prune(third)
    assert third.number not in rung_decisions(study.user_attrs)


def test_a_recorded_decision_stands_when_the_trial_is_asked_again() -> None:
    """A trial restarted from a checkpoint (or its search resumed) is asked again at the
    rungs it passed: a promoted one is not pruned there again, a pruned one is pruned
    again at its first question, and neither decision is rewritten."""
    storage = optuna.storages.InMemoryStorage()
    study = _mo_study(ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=2), storage)
    _meet(study, [0.8, 10.0])
    promoted_number, pruned = _meet(study, [0.9, 5.0])
    assert not pruned
    loser_number, pruned = _meet(study, [0.1, 50.0])
    assert pruned
    before = dict(study.user_attrs)
    # The same trials in new processes: the study loaded afresh, new Trial objects.
    again = optuna.load_study(
        study_name=study.study_name,
        storage=storage,
        pruner=ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=2),
    )
    # Now worse than anything at rung 0: it keeps the promotion it had.
    assert not _ask_again(storage, again, promoted_number, [0.0, 99.0], step=1)
    # Now better than anything: it stays pruned.
    assert _ask_again(storage, again, loser_number, [1.0, 0.1], step=2)
    assert dict(again.user_attrs) == before


def _ask_again(
    storage: optuna.storages.BaseStorage,
    study: optuna.Study,
    number: int,
    values: list[float],
    step: int,
) -> bool:
    """Trial ``number`` reports ``values`` and asks, as a rank 0 does (by the trial's id)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
    live = optuna.trial.Trial(study, trial_id)
    report_objectives(live, values, step)
    return should_prune(live)


def test_a_nan_value_is_pruned_at_once_and_ranks_against_nobody() -> None:
    study = _mo_study(ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=2))
    diverged, pruned = _meet(study, [math.nan, 3.0])
    assert pruned
    recorded = rung_decisions(study.user_attrs)[diverged]
    assert not recorded[0].promoted and not recorded[0].comparable
    # The next trial is alone at the rung: the NaN trial does not count.
    assert _meet(study, [0.1, 99.0]) == (1, False)


def test_hyperband_ranks_each_trial_within_its_bracket() -> None:
    pruner = ParetoHyperbandPruner(min_resource=1, max_resource=9, reduction_factor=3)
    study = _mo_study(pruner)
    brackets: dict[int, list[int]] = {}
    for number in range(30):
        values = [0.5 + 0.01 * number, 10.0]  # each better than every earlier trial
        assert _meet(study, values, step=9)[0] == number
        brackets.setdefault(pruner.bracket(study.study_name, number), []).append(number)
    assert len(brackets) == pruner.brackets == 3
    recorded = rung_decisions(study.user_attrs)
    for bracket, numbers in brackets.items():
        # Bracket s's first rung is at 3 ** s; trials of other brackets never compete.
        for number in numbers:
            assert recorded[number][0].step == 9
            assert len(recorded[number]) == 3 - bracket
            assert all(decision.promoted for decision in recorded[number])


def test_should_prune_in_a_multi_objective_study_needs_a_pareto_pruner() -> None:
    study = _mo_study(optuna.pruners.NopPruner())
    assert _meet(study, [0.5, 1.0]) == (0, False)
    study = _mo_study(optuna.pruners.SuccessiveHalvingPruner())
    with pytest.raises(TypeError, match="needs a ParetoSuccessiveHalvingPruner"):
        _meet(study, [0.5, 1.0])
    with pytest.raises(ValueError, match="1 values for a study of 2 objectives"):
        report_objectives(study.ask(), [0.5], 1)


def test_build_pruner_knows_both_kinds() -> None:
    ours = build_pruner(
        PrunerSpec(name="ParetoSuccessiveHalvingPruner", kwargs={"min_resource": 2})
    )
    assert isinstance(ours, ParetoSuccessiveHalvingPruner) and ours.rung_steps(2) == [2, 6]
    assert isinstance(
        build_pruner(PrunerSpec(name="MedianPruner", kwargs={"n_warmup_steps": 1})),
        optuna.pruners.MedianPruner,
    )
    assert isinstance(build_pruner(None), optuna.pruners.NopPruner)
    with pytest.raises(ValueError, match="max_resource"):
        ParetoHyperbandPruner(min_resource=3, max_resource=3)


def test_a_pruned_multi_objective_search_on_sqlite_keeps_sampling(tmp_path: Path) -> None:
    """What the samplers read of pruned trials is Optuna's own (no intermediate values,
    which make TPE's next ask fail in a multi-objective study), and the decisions survive
    the storage's JSON (an infinite cost included)."""
    url = f"sqlite:///{tmp_path / 'mo.db'}"
    samplers = {
        "tpe": optuna.samplers.TPESampler(n_startup_trials=3, seed=0, constant_liar=True),
        "nsga2": optuna.samplers.NSGAIISampler(population_size=4, seed=0),
        "random": optuna.samplers.RandomSampler(seed=0),
    }
    for name, sampler in samplers.items():
        study = optuna.create_study(
            study_name=name,
            directions=MAX_MIN,
            storage=url,
            sampler=sampler,
            pruner=ParetoSuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
        )
        for _ in range(7):
            _run_to_end_or_pruned(study)
        loaded = optuna.load_study(study_name=name, storage=url)
        states = {t.number: t.state for t in loaded.trials}
        pruned = [n for n, state in states.items() if state == optuna.trial.TrialState.PRUNED]
        assert pruned and optuna.trial.TrialState.COMPLETE in states.values(), name
        recorded = rung_decisions(loaded.user_attrs)
        assert all(stopped_at(recorded[number]) is not None for number in pruned)
        assert all(loaded.trials[number].values is None for number in pruned)


def _run_to_end_or_pruned(study: optuna.Study) -> None:
    trial = study.ask()
    quality = trial.suggest_float("quality", 0.0, 1.0)
    cost = trial.suggest_float("cost", 1.0, 10.0)
    for step in range(1, 5):
        values = [quality * step / 4, math.inf if cost > 9.0 else cost * step]
        report_objectives(trial, values, step)
        if should_prune(trial):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
    study.tell(trial, values)
