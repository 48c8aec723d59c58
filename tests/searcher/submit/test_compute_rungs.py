"""ASHA's rungs in slot-seconds (``pruner.resource: slot_seconds``) against a real Optuna study.

Each trial reports at the step the runtime computes: its compute from its runs' spans
(:func:`trials.slot_seconds_spent`) in Optuna's steps. The same reports in epochs show
what compute rungs change: an epoch of a trial on more slots with a smaller batch costs
more, and at equal epochs the pruner would compare trials at unequal cost.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import optuna
import pytest

from searcher.submit.samplers import build_pruner
from trials import RunSpan, slot_seconds_spent
from trials.config import ExperimentConfig, parse_config, slot_seconds_step

T0 = dt.datetime(2026, 1, 1)


def _config(pruner: dict[str, Any]) -> ExperimentConfig:
    return parse_config(
        {
            "name": "rungs",
            "entrypoint": "model:Trial",
            "hyperparameters": {"global_batch_size": 64},
            "searcher": {
                "name": "random",
                "metric": "val_accuracy",
                "smaller_is_better": False,
                "max_trials": 10,
                "max_length": {"epochs": 27},
                "pruner": {"name": "asha", "reduction_factor": 3, **pruner},
            },
        }
    )


def _study(config: ExperimentConfig) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", pruner=build_pruner(config))


def _compute_step(slots: int, seconds_per_epoch: float, epoch: int) -> int:
    """The step the runtime reports at ``epoch``: one run training since T0."""
    moment = T0 + dt.timedelta(seconds=seconds_per_epoch * epoch)
    return slot_seconds_step(slot_seconds_spent([RunSpan(T0)], slots, moment))


# (slots, training seconds per epoch, validation accuracy after each epoch)
PEERS = [
    (1, 0.25, [0.85, 0.90, 0.93, 0.95]),
    (1, 0.25, [0.84, 0.89, 0.92, 0.94]),
    (1, 0.25, [0.83, 0.88, 0.91, 0.93]),
]
# 1.6 slot-seconds per epoch (2 slots, a small batch): better than the peers at epoch 1,
# worse than them at the same compute (they had 4 epochs in 1 slot-second).
EXPENSIVE = (2, 0.8, [0.90])
# 0.25 slot-seconds per epoch: worse than the peers' first epoch, but it has spent a
# quarter of their compute there; at equal compute it is the best.
CHEAP = (1, 0.25, [0.80, 0.90, 0.94, 0.96])


def _run(
    study: optuna.Study, trial_spec: tuple[int, float, list[float]], *, compute: bool
) -> bool:
    """Report the trial's epochs, asking the pruner after each; whether it was pruned."""
    slots, seconds, values = trial_spec
    trial = study.ask()
    for epoch, value in enumerate(values, start=1):
        step = _compute_step(slots, seconds, epoch) if compute else epoch
        trial.report(value, step)
        if trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return True
    study.tell(trial, values[-1])
    return False


@pytest.mark.parametrize("compute", [True, False], ids=["slot_seconds", "epochs"])
def test_compute_rungs_prune_the_trial_that_spent_more_for_less(compute: bool) -> None:
    pruner = {"resource": "slot_seconds", "min_resource": 1.0} if compute else {}
    study = _study(_config(pruner))
    for peer in PEERS:
        _run(study, peer, compute=compute)
    expensive_pruned = _run(study, EXPENSIVE, compute=compute)
    cheap_pruned = _run(study, CHEAP, compute=compute)
    if compute:
        # At the 1 slot-second rung the expensive trial (1.6 slot-s, 0.90) meets peers
        # that had 0.93 to 0.95 for 1 slot-s; the cheap one is not compared before it
        # has spent 1 slot-second, and there it leads (0.96).
        assert (expensive_pruned, cheap_pruned) == (True, False)
        cheap = study.trials[-1]
        assert sorted(cheap.intermediate_values) == [25, 50, 75, 100]
    else:
        # In epochs it is the other way round: equal epochs, unequal cost.
        assert (expensive_pruned, cheap_pruned) == (False, True)


def test_a_rung_passed_before_a_restart_is_not_met_again() -> None:
    """After a restart the count carries on from the earlier run: no rung twice."""
    config = _config({"resource": "slot_seconds", "min_resource": 1.0})
    study = _study(config)
    for peer in PEERS:
        _run(study, peer, compute=True)
    trial = study.ask()
    # Run 0 trained 1.5 slot-seconds (past the 1 slot-second rung, as the best) and died;
    # run 1, restored from its checkpoint, validates 0.5 s into its training.
    first = RunSpan(T0, last_progress_at=T0 + dt.timedelta(seconds=1.5))
    trial.report(0.97, slot_seconds_step(slot_seconds_spent([first], 1, first.last_progress_at)))
    assert not trial.should_prune()
    restart = RunSpan(T0 + dt.timedelta(seconds=10))
    moment = T0 + dt.timedelta(seconds=10.5)
    step = slot_seconds_step(slot_seconds_spent([first, restart], 1, moment))
    assert step == 200  # not 50: the restart's steps do not start over below the rung
    trial.report(0.96, step)
    assert not trial.should_prune()
    assert sorted(study.trials[-1].intermediate_values) == [150, 200]
