"""Rank 0 skips asking the pruner only where Optuna's own pruner would answer no.

Each case runs two real Optuna studies on the same reports: one asks its pruner at
every validation, the other only where :class:`PruneGate` says to. Every trial must be
pruned at the same step in both (a skipped ask must never hide a yes, nor change the
rung values later trials are compared with), and the gate must skip most asks.
"""

from __future__ import annotations

import random

import optuna
import pytest

from trials.config import PrunerSpec, slot_seconds_step
from trials.pruning import build_pruner
from trials.runtime._prune_gate import PruneGate

PRUNERS = [
    PrunerSpec(name="SuccessiveHalvingPruner", kwargs={"min_resource": 1, "reduction_factor": 3}),
    PrunerSpec(
        name="SuccessiveHalvingPruner",
        kwargs={"min_resource": 2, "reduction_factor": 2, "min_early_stopping_rate": 1},
    ),
    PrunerSpec(
        name="HyperbandPruner",
        kwargs={"min_resource": 1, "max_resource": 27, "reduction_factor": 3},
    ),
    PrunerSpec(name="MedianPruner", kwargs={"n_startup_trials": 2, "n_warmup_steps": 4}),
]


def _search(spec: PrunerSpec, curves: list[list[float]], *, gated: bool) -> tuple[list[int], int]:
    """Each trial's pruned step (0: never pruned) and the number of asks, one trial at a time."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="gate",  # Hyperband picks brackets by the study name
        direction="maximize",
        pruner=build_pruner(spec),
        sampler=optuna.samplers.RandomSampler(0),
    )
    pruned_at, asks = [], 0
    for curve in curves:
        trial = study.ask()
        gate = PruneGate(spec, slots=1)
        stopped = 0
        for step, value in enumerate(curve, start=1):
            trial.report(value, step)
            gate.validated(moment=float(step), step=step)
            if gated and not gate.must_ask():
                continue
            asks += 1
            gate.asked()
            if trial.should_prune():
                stopped = step
                break
        pruned_at.append(stopped)
        if stopped:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, curve[-1])
    return pruned_at, asks


@pytest.mark.parametrize("spec", PRUNERS, ids=lambda spec: spec.name)
def test_skipped_asks_change_no_pruning_decision(spec: PrunerSpec) -> None:
    rng = random.Random(7)
    curves = []
    for _ in range(40):
        rate = rng.uniform(0.02, 0.3)
        curves.append([min(1.0, rate * step + rng.gauss(0, 0.05)) for step in range(1, 28)])
    every, every_asks = _search(spec, curves, gated=False)
    gated, gated_asks = _search(spec, curves, gated=True)
    assert gated == every
    assert any(every), "the case must prune something to mean anything"
    if spec.name == "MedianPruner":
        assert gated_asks < every_asks
    else:
        assert gated_asks < every_asks / 3


def test_an_unknown_pruner_or_an_automatic_min_resource_is_always_asked() -> None:
    unknown = PrunerSpec(name="PatientPruner", kwargs={"patience": 2})
    auto = PrunerSpec(name="SuccessiveHalvingPruner", kwargs={})
    for spec in (unknown, auto):
        assert all(spec.may_prune(step - 1, step) for step in range(1, 30))
    assert PruneGate(None, slots=1).must_ask()


def test_in_slot_seconds_no_rung_is_skipped_whatever_the_validations_moments() -> None:
    """The count grows by the slots per second of training; every rung crossed is asked."""
    spec = PrunerSpec(
        name="SuccessiveHalvingPruner",
        kwargs={"min_resource": slot_seconds_step(0.5), "reduction_factor": 3},
    )
    rng = random.Random(3)
    for _ in range(50):
        slots = rng.choice([1, 2, 4])
        earlier = rng.uniform(0, 3)  # compute of the trial's earlier runs
        started = rng.uniform(0, 100)
        gate = PruneGate(spec, slots=slots)
        moment, asked_at, asks = started, None, 0
        for _ in range(60):
            moment += rng.uniform(0.001, 0.2)
            spent = earlier + slots * (moment - started)
            step = slot_seconds_step(spent)
            gate.validated(moment=moment)
            rung_crossed = spec.may_prune(asked_at, step)
            if gate.must_ask():
                asks += 1
                gate.asked(spent=spent)
                asked_at = step
            else:
                assert not rung_crossed, (asked_at, step)
        assert asks < 30
