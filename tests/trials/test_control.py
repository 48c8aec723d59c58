"""Pause, kill and activate in every state, through the one function and both callers.

Real database, real Optuna study: the experiment is created as ``slotsweep run --detach``
creates it, its trials are asked from Optuna as the driver asks them, and a "running"
experiment's driver is this test process (fresh heartbeat, live pid on this host).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from sqlalchemy import select

from searcher.experiments import UsageError
from searcher.experiments import request_action as cli_request_action
from searcher.submit import samplers
from searcher.submit.creation import create_experiment
from storage import (
    Experiment,
    ExperimentState,
    Trial,
    TrialState,
    optuna_storage,
    optuna_trial_id,
    session_scope,
    utcnow,
)
from tests.searcher.conftest import write_experiment
from trials.config import load_config
from trials.coordination import control
from ui import _actions

STATES = ("never-started", "running", "paused", "COMPLETED", "CANCELED", "ERROR")
TERMINAL = ("COMPLETED", "CANCELED", "ERROR")


def make_experiment(db_url: str, folder: Path, state: str) -> int:
    """An experiment in ``state`` with one finished and one queued trial, as the driver leaves them."""
    path = write_experiment(folder)
    config = load_config(path)
    experiment_id = create_experiment(
        config, config_path=path, db_url=db_url, directions=samplers.study_directions(config)
    )
    with session_scope(db_url) as session:
        study_name = session.get(Experiment, experiment_id).study_name  # type: ignore[union-attr]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db_url))
    done, queued = study.ask(), study.ask()
    study.tell(done, 0.5)
    with session_scope(db_url) as session:
        for asked, trial_state in ((done, TrialState.COMPLETED), (queued, TrialState.QUEUED)):
            session.add(
                Trial(
                    experiment_id=experiment_id,
                    optuna_trial_id=optuna_trial_id(db_url, study_name, asked.number),
                    optuna_trial_number=asked.number,
                    state=trial_state,
                    hparams={"lr": 0.1},
                    slots_per_trial=2,
                )
            )
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        if state == "running":
            experiment.driver_host = socket.gethostname()
            experiment.driver_pid = os.getpid()
            experiment.driver_heartbeat_at = utcnow()
        elif state == "paused":
            experiment.state = ExperimentState.PAUSED
        elif state in TERMINAL:
            experiment.state = ExperimentState(state)
    return experiment_id


def snapshot(db_url: str, experiment_id: int) -> tuple[str, str | None, list[str], list[str]]:
    """(experiment state, requested action, trial states, Optuna trial states)."""
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        trials = session.scalars(
            select(Trial.state)
            .where(Trial.experiment_id == experiment_id)
            .order_by(Trial.optuna_trial_number)
        )
        result = (experiment.state.value, experiment.requested_action, [t.value for t in trials])
        study_name = experiment.study_name
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db_url))
    return (*result, [t.state.name for t in study.get_trials(deepcopy=False)])


def _via_ui(db_url: str, experiment_id: int, action: str) -> str:
    return _actions.request_action(db_url, experiment_id, action)


def _via_cli(db_url: str, experiment_id: int, action: str) -> str:
    try:
        return cli_request_action(db_url, str(experiment_id), action)
    except UsageError as exc:
        return str(exc)


# (state, action) -> (experiment state, requested action, trial states, Optuna states, words)
EXPECTED: dict[tuple[str, str], tuple[str, str | None, list[str], list[str], str]] = {
    ("never-started", "pause"): (
        "PAUSED",
        None,
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "slotsweep resume",
    ),
    ("never-started", "kill"): (
        "CANCELED",
        None,
        # The queued trial never started: not run, no failure (Optuna hears FAIL).
        ["COMPLETED", "NOT_RUN"],
        ["COMPLETE", "FAIL"],
        "CANCELED",
    ),
    ("never-started", "activate"): (
        "ACTIVE",
        None,
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "slotsweep resume",
    ),
    ("running", "pause"): (
        "ACTIVE",
        "pause",
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "Requested pause",
    ),
    ("running", "kill"): (
        "ACTIVE",
        "kill",
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "Requested kill",
    ),
    ("running", "activate"): (
        "ACTIVE",
        None,
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "already running",
    ),
    ("paused", "pause"): (
        "PAUSED",
        None,
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "already PAUSED",
    ),
    ("paused", "kill"): (
        "CANCELED",
        None,
        # The queued trial never started: not run, no failure (Optuna hears FAIL).
        ["COMPLETED", "NOT_RUN"],
        ["COMPLETE", "FAIL"],
        "CANCELED",
    ),
    ("paused", "activate"): (
        "PAUSED",
        None,
        ["COMPLETED", "QUEUED"],
        ["COMPLETE", "RUNNING"],
        "slotsweep resume",
    ),
}
for _state in TERMINAL:
    for _action in control.Action:
        EXPECTED[(_state, _action)] = (
            _state,
            None,
            ["COMPLETED", "QUEUED"],
            ["COMPLETE", "RUNNING"],
            f"already {_state}",
        )


@pytest.mark.parametrize("path", [_via_ui, _via_cli], ids=["ui", "cli"])
@pytest.mark.parametrize("action", [action.value for action in control.Action])
@pytest.mark.parametrize("state", STATES)
def test_every_action_in_every_state(
    db_url: str,
    tmp_path: Path,
    state: str,
    action: str,
    path: Callable[[str, int, str], str],
) -> None:
    experiment_id = make_experiment(db_url, tmp_path / "exp", state)
    message = path(db_url, experiment_id, action)
    *expected, words = EXPECTED[(state, action)]
    assert list(snapshot(db_url, experiment_id)) == expected, message
    assert words in message and str(experiment_id) in message, message


def test_refusals_raise_from_the_function_and_read_as_sentences(
    db_url: str, tmp_path: Path
) -> None:
    finished = make_experiment(db_url, tmp_path / "exp", "COMPLETED")
    with pytest.raises(control.ActionRefused, match="already COMPLETED"):
        control.request_action(db_url, finished, "pause")
    activate = _actions.request_action(db_url, finished, "activate")
    assert f"slotsweep continue {finished}" in activate
    assert _actions.request_action(db_url, 9999, "kill") == "Experiment 9999 does not exist."
    with pytest.raises(ValueError, match="action: must be one of pause, kill, activate"):
        _actions.request_action(db_url, finished, "delete")
    assert list(_actions.ACTIONS) == [action.value for action in control.Action]


def test_activate_withdraws_a_pause_the_driver_has_not_read(db_url: str, tmp_path: Path) -> None:
    experiment_id = make_experiment(db_url, tmp_path / "exp", "running")
    control.request_action(db_url, experiment_id, "pause")
    message = control.request_action(db_url, experiment_id, "activate")
    assert "withdrawn" in message
    assert snapshot(db_url, experiment_id)[:2] == ("ACTIVE", None)
    # A pending kill is not turned into a pause.
    control.request_action(db_url, experiment_id, "kill")
    assert "kill is already requested" in control.request_action(db_url, experiment_id, "pause")
    assert snapshot(db_url, experiment_id)[1] == "kill"


def test_a_dead_driver_counts_as_no_driver(db_url: str, tmp_path: Path) -> None:
    experiment_id = make_experiment(db_url, tmp_path / "exp", "running")
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.driver_heartbeat_at = utcnow().replace(year=2000)
    control.request_action(db_url, experiment_id, "kill")
    assert snapshot(db_url, experiment_id)[0] == "CANCELED"
