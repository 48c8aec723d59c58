"""``slotsweep continue``: more trials in the same study, numbered on from the old ones,
proposed by a TPE that conditions on every earlier trial; old trials untouched."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from sqlalchemy import func, select

from searcher.submit import samplers, space
from storage import Experiment, Metric, Trial, optuna_storage, session_scope
from tests.searcher.conftest import run_cli, write_experiment
from trials.config import ExperimentConfig


def _old_trials_record(db: str) -> list[tuple[int, str, float | None, int]]:
    """(number, state, metric value, metric rows) of each trial."""
    with session_scope(db) as session:
        return [
            (t.optuna_trial_number, t.state.value, t.searcher_metric_value, int(count))
            for t, count in session.execute(
                select(Trial, func.count(Metric.id))
                .outerjoin(Metric, Metric.trial_id == Trial.id)
                .group_by(Trial.id)
                .order_by(Trial.optuna_trial_number)
            )
        ]


@pytest.mark.slow
def test_continue_extends_a_completed_search_in_the_same_study(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # One-slot trials two at a time: the old trials, then the new ones, in two rounds.
    path = write_experiment(
        tmp_path / "exp",
        searcher={"max_trials": 2, "n_startup_trials": 2, "max_concurrent_trials": 2},
        resources={"slots_per_trial": 1},
    )
    db = f"sqlite:///{tmp_path / 'search.db'}"
    common = ["--db", db, "--slots", "2", "--no-progress"]
    first = run_cli(["run", str(path), *common], cli_env, tmp_path)
    assert first.returncode == 0, first.stderr
    before = _old_trials_record(db)
    assert [row[0] for row in before] == [0, 1]

    refused = run_cli(["continue", "1", "--max-trials", "2", "--db", db], cli_env, tmp_path)
    assert refused.returncode == 2 and "already has 2 trials" in refused.stderr
    extended = run_cli(["continue", "1", "--more-trials", "2", *common], cli_env, tmp_path)
    assert extended.returncode == 0, extended.stderr
    assert "experiment 1 COMPLETED" in extended.stdout

    after = _old_trials_record(db)
    assert [row[0] for row in after] == [0, 1, 2, 3]
    assert after[:2] == before  # states, values and metric rows of the old trials
    with session_scope(db) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        assert experiment.max_trials == 4 and experiment.config["searcher"]["max_trials"] == 4
        config = ExperimentConfig.model_validate(experiment.config)
        study_name = experiment.study_name
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db))
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == [0, 1, 2, 3]

    # Trial 2 is what the resumed TPE proposes given trials 0 and 1 (past its two
    # startup trials, so it is the model's choice, not a random draw; asked before
    # trial 3, so nothing ran beside it yet): replay it.
    replay = optuna.create_study(
        directions=samplers.study_directions(config),
        sampler=samplers.build_sampler(config, trials_so_far=2),
    )
    replay.add_trials(trials[:2])
    proposed = space.suggest_hparams(replay.ask(), config.hyperparameters)
    assert {name: proposed[name] for name in trials[2].params} == trials[2].params
