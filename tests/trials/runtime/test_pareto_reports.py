"""Rank 0's reports to a multi-objective study's pruner (``searcher.objectives`` with
ASHA): the metric of the validation it asks about, with what the trial had spent of each
cost by then, and the pruner's rung decisions recorded in the study. One rank in this process against a
real SQLite database and Optuna study."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import optuna
from sqlalchemy import update

from storage import Trial, TrialRun, optuna_storage, session_scope, utcnow
from trials.pruning import read_report, rung_decisions
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial

from .conftest import TrialHandle

PARETO_ASHA = {
    "name": "ParetoSuccessiveHalvingPruner",
    "kwargs": {"min_resource": 1, "reduction_factor": 3},
}


def test_rank_zero_reports_the_metric_with_the_costs_spent_and_the_pruner_decides(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        pruner=PARETO_ASHA,
        directions=["minimize", "minimize", "minimize"],
        objectives=["slot_seconds", "wall_seconds"],
        slots_per_trial=1,
        attempt=1,
    )
    earlier = utcnow() - dt.timedelta(seconds=100)
    with session_scope(handle.db_url) as session:
        # Started 100 s ago; its attempt 0 trained 4 s: both costs count them.
        session.execute(
            update(Trial).where(Trial.id == handle.spec.trial_id).values(started_at=earlier)
        )
        session.add(
            TrialRun(
                trial_id=handle.spec.trial_id,
                attempt=0,
                training_started_at=earlier,
                progress_at=earlier + dt.timedelta(seconds=4),
                ended_at=earlier + dt.timedelta(seconds=5),
            )
        )
    assert run_trial(handle.spec, DistributedInfo()) == "finished"

    study = optuna.load_study(
        study_name=handle.spec.study_name, storage=optuna_storage(handle.db_url)
    )
    frozen = study.trials[handle.spec.optuna_trial_number]
    # Reported as objectives, never as Optuna's intermediate values (a multi-objective
    # study's samplers would fail on those once the trial is pruned).
    assert frozen.intermediate_values == {}
    # Written when the pruner was asked: at the validation of batch 4 (the one at 8 is
    # the trial's last, where nothing is asked).
    report = read_report(frozen.user_attrs)
    assert report is not None and report.step == 4
    loss, slot_seconds, wall_seconds = report.values
    assert loss >= 0.0
    assert 4.0 <= slot_seconds < 60.0
    assert 100.0 <= wall_seconds < 160.0
    # Validations at batches 4 and 8 passed the rungs at 1 and 3 (alone: promoted).
    decisions = rung_decisions(study.user_attrs)[handle.spec.optuna_trial_number]
    assert [(d.rung, d.step, d.promoted) for d in decisions] == [(0, 4, True), (1, 4, True)]
    assert decisions[0].values == decisions[1].values == report.values
