"""A real multi-objective search with pruning: ``objectives: [slot_seconds]`` and ASHA,
warm workers, real torchrun jobs, a real SQLite file and study, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import select

from storage import (
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import assert_search_consistent, run_cli, write_experiment
from trials.pruning import rung_decisions, stopped_at

pytestmark = pytest.mark.slow

#: The trials that learn nothing and sleep in every batch (``DearAndWorseDigitsTrial``).
DEAR = [1, 3, 5]


def pareto_experiment(folder: Path, **overrides: Any) -> Path:
    """Six trials of the digits MLP, one at a time, ranked on accuracy against compute
    at rungs of 1 and 3 epochs: half of them worse and dearer than the rest.

    ``overrides`` replace a field, or update a section given as a mapping."""
    settings: dict[str, Any] = {
        "entrypoint": "slow_model:DearAndWorseDigitsTrial",
        "hyperparameters": {
            "global_batch_size": 64,
            "lr": 0.05,
            "optimizer": "sgd",
            "warmup_epochs": 0,
            "lr_decay": "constant",
        },
        "searcher": {
            "name": "random",
            "seed": 1,
            "metric": "val_accuracy",
            "smaller_is_better": False,
            "max_trials": 6,
            "max_length": {"epochs": 4},
            "max_concurrent_trials": 1,
            "objectives": ["slot_seconds"],
            "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 3},
        },
        "resources": {"slots_per_trial": 1, "reuse_workers": True},
        "data": {"dear_trials": DEAR, "dear_batch_delay_s": 0.01},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return write_experiment(folder, **settings)


def test_a_search_of_accuracy_against_compute_prunes_the_dominated_trials(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = pareto_experiment(tmp_path / "exp")
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    result = run_cli(
        ["run", str(path), "--db", db, "--slots", "1", "--no-progress"], cli_env, tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]

    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        study_name = experiment.study_name
        trials = {t.optuna_trial_number: t for t in session.scalars(select(Trial))}
        states = {number: trial.state for number, trial in trials.items()}
        last_epoch = {
            n: session.scalars(
                select(Metric.epoch)
                .where(Metric.trial_id == t.id, Metric.kind == MetricKind.VALIDATION)
                .order_by(Metric.step.desc())
            ).first()
            for n, t in trials.items()
        }
        runs = {
            n: len(session.scalars(select(TrialRun.id).where(TrialRun.trial_id == t.id)).all())
            for n, t in trials.items()
        }
    # Worse and dearer than trial 0 at the first rung: every one of them stops there.
    assert {n for n, state in states.items() if state == TrialState.PRUNED} >= set(DEAR)
    assert TrialState.COMPLETED in states.values()
    assert set(runs.values()) == {1}

    study = optuna.load_study(study_name=study_name, storage=db)
    assert len(study.directions) == 2
    decisions = rung_decisions(study.user_attrs)
    for trial in study.trials:
        made = decisions[trial.number]
        if trial.state == optuna.trial.TrialState.PRUNED:
            # Where it stopped: the rung, its epoch and what it had there.
            stop = stopped_at(made)
            assert stop is not None and stop is made[-1]
            assert stop.step == last_epoch[trial.number] and stop.step in (1, 3)
            accuracy, compute = stop.values
            assert 0.0 <= accuracy <= 1.0 and compute > 0.0
            assert trial.values is None
        else:
            assert trial.state == optuna.trial.TrialState.COMPLETE
            assert [d.step for d in made] == [1, 3] and all(d.promoted for d in made)
            assert trial.values is not None and trial.values[1] > 0.0
    assert_search_consistent(db)

    # describe lists the front (Optuna's own Pareto-optimal trials) and the stops.
    described = run_cli(["describe", "1", "--db", db, "--json"], cli_env, tmp_path)
    assert described.returncode == 0, described.stderr
    front = json.loads(described.stdout)
    assert [row["number"] for row in front["pareto_front"]] == sorted(
        (t.number for t in study.best_trials),
        key=lambda number: -study.trials[number].values[0],
    )
    pruned_at = {row["number"]: row for row in front["pruned_at"]}
    assert set(pruned_at) == {n for n, state in states.items() if state == TrialState.PRUNED}
    for number, row in pruned_at.items():
        stop = stopped_at(decisions[number])
        assert stop is not None
        assert (row["rung"], row["step"], row["unit"]) == (stop.rung, stop.step, "epochs")
        assert (row["val_accuracy"], row["slot_seconds"]) == stop.values
    table = run_cli(["describe", "1", "--db", db], cli_env, tmp_path).stdout
    assert "Pareto front" in table
    assert all(f"#{number} pruned at rung 0 (epoch 1): val_accuracy" in table for number in DEAR)
