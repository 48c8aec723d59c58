"""The README's first command on a machine of one slot: the example, unchanged, runs.

``examples/digits`` asks for trials of two slots with ``resources.shrink_to_fit``: where
two slots exist (this machine's two cores, two GPUs) its trials are two-rank DDP jobs
(tests/searcher/test_search_e2e.py), and where one does (a one-GPU machine, here
``--slots 1``) they run on one, as the run's first line says.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import select

from storage import Experiment, ExperimentState, Trial, TrialState, session_scope
from tests.conftest import EXAMPLES_DIR
from tests.searcher.conftest import run_cli
from trials.config import ConfigError, parse_config, read_stored_config


def test_shrink_to_fit_is_refused_with_a_searched_size() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "name": "e",
                "entrypoint": "model:T",
                "hyperparameters": {
                    "global_batch_size": 64,
                    "slots_per_trial": {"type": "categorical", "vals": [1, 2]},
                },
                "searcher": {
                    "name": "random",
                    "metric": "val_loss",
                    "max_trials": 2,
                    "max_length": {"epochs": 1},
                },
                "resources": {"shrink_to_fit": True},
            }
        )
    assert info.value.problems == [
        "hyperparameters.slots_per_trial: not with resources.shrink_to_fit, which shrinks "
        "resources.slots_per_trial only; every searched size must fit the pool"
    ]


@pytest.mark.slow
def test_the_unchanged_example_runs_on_one_slot_and_says_so_first(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    folder = tmp_path / "digits"
    folder.mkdir()
    for name in ("experiment.yaml", "model.py"):
        shutil.copy(EXAMPLES_DIR / "digits" / name, folder / name)
    db = f"sqlite:///{tmp_path / 'slotsweep.db'}"
    cli_env["SLOTSWEEP_LOG_DIR"] = str(tmp_path / "logs")
    result = run_cli(
        ["run", "experiment.yaml", "--slots", "1", "--db", db], cli_env, folder, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # Rich wraps the lines at the terminal's width (80 columns without one).
    first = " ".join(result.stderr.split("experiment 1 (digits-large-batch) created")[0].split())
    assert first == (
        "resources.slots_per_trial: 2 cannot be placed in resource pool 'default'; "
        "shrink_to_fit: each trial runs on 1 slot(s), the most it can"
    )
    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        assert read_stored_config(experiment.config).resources.slots_per_trial == 1
        trials = session.scalars(select(Trial)).all()
        assert len(trials) == 8
        assert {t.slots_per_trial for t in trials} == {1}
        assert {t.state for t in trials} <= {TrialState.COMPLETED, TrialState.PRUNED}
