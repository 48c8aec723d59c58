"""A trial runs only with all of its hyperparameters.

An Optuna trial asked but never given its values (the driver died between ``ask`` and
the suggestions) is failed and replaced on resume, never run with the constants
alone; a trial row whose hyperparameters lack one of the space's is refused at launch.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from sqlalchemy import select

from storage import (
    Experiment,
    Trial,
    TrialRun,
    TrialState,
    optuna_storage,
    optuna_trial_id,
    session_scope,
)
from tests.searcher.conftest import assert_search_consistent, run_cli, write_experiment

pytestmark = pytest.mark.slow


def _create(tmp_path: Path, cli_env: dict[str, str], max_trials: int) -> tuple[str, Path]:
    path = write_experiment(
        tmp_path / "exp",
        searcher={
            "max_trials": max_trials,
            "max_length": {"epochs": 1},
            "pruner": {"name": "none"},
        },
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    created = run_cli(["run", str(path), "--db", db, "--detach"], cli_env, tmp_path)
    assert created.returncode == 0, created.stderr
    return db, path


def _study(db: str) -> optuna.Study:
    with session_scope(db) as session:
        name = session.scalars(select(Experiment.study_name)).one()
    return optuna.load_study(study_name=name, storage=optuna_storage(db))


def test_an_asked_trial_without_its_values_is_failed_and_replaced(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db, _ = _create(tmp_path, cli_env, max_trials=1)
    # What a driver killed right after ``study.ask()`` leaves behind.
    orphan = _study(db).ask()

    resumed = run_cli(
        ["resume", "digits-large-batch", "--db", db, "--no-progress"], cli_env, tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    trials = {t.number: t for t in _study(db).get_trials(deepcopy=False)}
    assert trials[orphan.number].state == optuna.trial.TrialState.FAIL
    completed = [t for t in trials.values() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(completed) == 1
    assert {"lr", "optimizer", "global_batch_size"} <= set(completed[0].params)
    with session_scope(db) as session:
        rows = list(session.scalars(select(Trial)))
    assert [row.optuna_trial_number for row in rows] == [completed[0].number]
    assert_search_consistent(db)


def test_a_trial_missing_a_hyperparameter_is_never_launched(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db, _ = _create(tmp_path, cli_env, max_trials=1)
    study = _study(db)
    asked = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)})
    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        session.add(
            Trial(
                experiment_id=experiment.id,
                optuna_trial_id=optuna_trial_id(db, study.study_name, asked.number),
                optuna_trial_number=asked.number,
                state=TrialState.QUEUED,
                hparams={"lr": asked.params["lr"], "global_batch_size": 64},
                slots_per_trial=2,
            )
        )

    resumed = run_cli(
        ["resume", "digits-large-batch", "--db", db, "--no-progress"], cli_env, tmp_path
    )

    assert resumed.returncode in (0, 1), resumed.stderr[-3000:]
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.ERROR
        assert "no value for hyperparameter" in (trial.error or "")
        assert "optimizer" in (trial.error or "")
        assert session.scalars(select(TrialRun)).all() == []
    assert study.trials[asked.number].state == optuna.trial.TrialState.FAIL
