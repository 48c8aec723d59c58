"""What the multi-objective pruning benchmark counts, on a database written by hand."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna
import pytest
from pareto_pruning import SHARE, hypervolume_curve, search_config
from sqlalchemy import update

from searcher import parse_config
from storage import (
    Experiment,
    ExperimentState,
    TrialRun,
    TrialState,
    optuna_storage,
    session_scope,
)
from tests.conftest import add_experiment

T0 = dt.datetime(2026, 1, 1)
REFERENCE = (0.9, 4.0)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_the_arms_differ_only_in_the_pruner(tmp_path: Path) -> None:
    arms = {
        arm: search_config(arm, 3, max_trials=16, epochs=27, folder=tmp_path)
        for arm in ("unpruned", "pruned")
    }
    unpruned, pruned = (dict(arms[arm]["searcher"]) for arm in ("unpruned", "pruned"))
    assert unpruned.pop("pruner") == {"name": "none"}
    assert pruned.pop("pruner") == {"name": "asha", "min_resource": 1, "reduction_factor": 3}
    assert unpruned == pruned
    assert pruned["objectives"] == ["slot_seconds"] and pruned["metric"] == "val_accuracy"
    for config in arms.values():
        assert parse_config(config).resources.reuse_workers is True
    rest = [{k: v for k, v in arms[arm].items() if k not in ("name", "searcher")} for arm in arms]
    assert rest[0] == rest[1]


def test_the_front_grows_as_trials_complete_against_the_compute_held(db_url: str) -> None:
    """Three trials on one 1-slot trial span each (no warm job): 0-10 s, 10-20 s, 20-30 s.

    Trial 0 (0.95 at 2 slot-s) makes the front, trial 1 (0.92 at 3) is dominated, trial
    2 (0.97 at 3.5) adds the accurate end; trial 3 was pruned and has no values.
    """
    spans = [(0.0, 10.0), (10.0, 20.0), (20.0, 30.0), (30.0, 31.0)]
    experiment_id, trial_ids = add_experiment(
        db_url,
        [
            {
                "state": TrialState.PRUNED if number == 3 else TrialState.COMPLETED,
                "started_at": _at(start),
                "ended_at": _at(end),
            }
            for number, (start, end) in enumerate(spans)
        ],
        state=ExperimentState.COMPLETED,
    )
    with session_scope(db_url) as session:
        study_name = session.get_one(Experiment, experiment_id).study_name
        for trial_id, (start, end) in zip(trial_ids, spans, strict=True):
            session.add(TrialRun(trial_id=trial_id, attempt=0, started_at=_at(start)))
            session.flush()
            session.execute(
                update(TrialRun).where(TrialRun.trial_id == trial_id).values(ended_at=_at(end))
            )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=study_name,
        storage=optuna_storage(db_url),
        directions=["maximize", "minimize"],
    )
    for values in ([0.95, 2.0], [0.92, 3.0], [0.97, 3.5]):
        study.tell(study.ask(), values)
    study.tell(study.ask(), state=optuna.trial.TrialState.PRUNED)

    curve = hypervolume_curve(db_url, REFERENCE)
    first = (0.95 - 0.9) * (4.0 - 2.0)
    both = first + (0.97 - 0.95) * (4.0 - 3.5)
    assert [p.hypervolume for p in curve.points] == pytest.approx([first, first, both])
    assert [p.held for p in curve.points] == pytest.approx([10.0, 20.0, 30.0])
    assert (curve.completed, curve.pruned) == (3, 1)
    assert curve.total.held == pytest.approx(31.0)
    # 95% of the final front: reached only with trial 2, at 30 slot-seconds.
    point, reached = curve.reaching(SHARE * both)
    assert reached and point.held == pytest.approx(30.0)
    assert curve.hypervolume_at(25.0) == pytest.approx(first)
    point, reached = curve.reaching(1.0)
    assert not reached and point.held == pytest.approx(31.0)
