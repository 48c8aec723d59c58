"""Pause, activate and kill an experiment: the one path the CLI and the UI both take.

A running experiment has a driver that polls ``Experiment.requested_action``; a
request is written there and the driver carries it out (pause: running trials
checkpoint and stop; kill: they stop now and the experiment is CANCELED). An
experiment with no live driver (created with ``--detach`` and never started, or
paused, or whose driver died) is changed here directly, so that a request is never
silently lost: a paused experiment stays paused until ``slotsweep resume``, and a
killed one is CANCELED with its unfinished trials failed, in this database and in
its Optuna study alike.

Example:
    >>> request_action(url, 1, "pause")
    'Experiment 1 paused (no driver was running); `slotsweep resume 1` continues it.'
"""

from __future__ import annotations

import enum
import os
import socket

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import (
    Experiment,
    ExperimentState,
    Trial,
    TrialState,
    optuna_storage,
    optuna_trial_id,
    session_scope,
    study_trials,
    utcnow,
)
from trials.coordination import allocations
from trials.coordination.attempts import end_run, open_runs
from trials.timings import timings_from_env


class Action(str, enum.Enum):
    """What a user may ask of a running experiment (``slotsweep pause|kill``, the UI).

    A ``str`` enum: a driver reads ``pause`` and ``kill`` from
    ``Experiment.requested_action`` as these values (``activate`` is never stored: it
    withdraws a pause, or is answered at once).
    """

    PAUSE = "pause"
    KILL = "kill"
    ACTIVATE = "activate"


# Seconds a leftover rank of a dead driver gets to exit after SIGTERM before SIGKILL.
_KILL_GRACE_S = 5.0


class ActionRefused(Exception):
    """The action cannot apply to the experiment in its state; the message says why."""


def driver_alive(experiment: Experiment) -> bool:
    """Whether a driver still owns ``experiment`` (fresh heartbeat, live pid if local)."""
    if experiment.driver_heartbeat_at is None:
        return False
    age = (utcnow() - experiment.driver_heartbeat_at).total_seconds()
    if age > timings_from_env().driver_stale_after_s:
        return False
    if experiment.driver_host == socket.gethostname() and experiment.driver_pid:
        try:
            os.kill(experiment.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


def request_action(db_url: str, experiment_id: int, action: Action | str) -> str:
    """Carry out ``action`` (pause, activate or kill) on an experiment; what happened, in words.

    Raises:
        ValueError: ``action`` is not an :class:`Action` (nor one's value).
        ActionRefused: no such experiment, or it has ended (the message names its state).
    """
    try:
        action = Action(action)
    except ValueError:
        allowed = ", ".join(member.value for member in Action)
        raise ValueError(f"action: must be one of {allowed}, got {action!r}") from None
    study_name: str | None = None
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        if experiment is None:
            raise ActionRefused(f"Experiment {experiment_id} does not exist.")
        if experiment.state.is_terminal:
            raise ActionRefused(_terminal_message(experiment, action))
        if driver_alive(experiment):
            message = _ask_driver(experiment, action)
        elif action == Action.KILL:
            _cancel(session, experiment)
            study_name = experiment.study_name
            message = (
                f"Experiment {experiment_id} killed: it is CANCELED and its unfinished "
                "trials are failed (no driver was running)."
            )
        elif action == Action.PAUSE:
            message = _pause_without_driver(experiment)
        else:
            message = (
                f"Experiment {experiment_id} is {experiment.state.value} with no driver; "
                f"`slotsweep resume {experiment_id}` runs it (its trials continue from "
                "their latest checkpoints)."
            )
    if study_name is not None:
        # Optuna uses its own connection: after our commit, never inside our transaction.
        _fail_open_optuna_trials(db_url, study_name)
    return message


def _terminal_message(experiment: Experiment, action: Action) -> str:
    text = f"Experiment {experiment.id} is already {experiment.state.value}; nothing to do."
    if action == Action.ACTIVATE and experiment.state == ExperimentState.COMPLETED:
        text += (
            f" `slotsweep continue {experiment.id} --more-trials K` extends it with K more trials."
        )
    return text


def _ask_driver(experiment: Experiment, action: Action) -> str:
    driver = f"its driver (pid {experiment.driver_pid} on {experiment.driver_host})"
    if action == Action.ACTIVATE:
        if experiment.requested_action == Action.PAUSE:
            # Withdrawn in time only if the driver has not read it yet; say so.
            experiment.requested_action = None
            return (
                f"Experiment {experiment.id}: pause request withdrawn; if {driver} had "
                f"already begun pausing, `slotsweep resume {experiment.id}` continues it "
                "once it is PAUSED."
            )
        return f"Experiment {experiment.id} is already running under {driver}; nothing to do."
    if experiment.requested_action == Action.KILL and action == Action.PAUSE:
        return f"Experiment {experiment.id}: a kill is already requested; it outranks a pause."
    experiment.requested_action = action.value
    then = (
        "running trials checkpoint and stop, then it is PAUSED"
        if action == Action.PAUSE
        else "running trials stop now, then it is CANCELED"
    )
    return f"Requested {action.value} of experiment {experiment.id}; {driver} acts on it at its next poll ({then})."


def _pause_without_driver(experiment: Experiment) -> str:
    if experiment.state == ExperimentState.PAUSED:
        return (
            f"Experiment {experiment.id} is already PAUSED; "
            f"`slotsweep resume {experiment.id}` continues it."
        )
    experiment.state = ExperimentState.PAUSED
    experiment.requested_action = None
    return (
        f"Experiment {experiment.id} paused (no driver was running); "
        f"`slotsweep resume {experiment.id}` continues it."
    )


def _cancel(session: Session, experiment: Experiment) -> None:
    """CANCEL a driverless experiment: end leftovers, free slots, fail unfinished trials."""
    now = utcnow()
    for trial in session.scalars(
        select(Trial).where(
            Trial.experiment_id == experiment.id,
            Trial.state.in_([TrialState.QUEUED, TrialState.RUNNING]),
        )
    ):
        # A dead driver may have left ranks running; they would hold their slots.
        for run in open_runs(session, trial.id):
            end_run(session, run, reason="experiment killed", grace_s=_KILL_GRACE_S)
        allocations.release(session, trial.id)
        # A trial that never started (asked, maybe ahead of its slots) is no failure.
        never_started = trial.state == TrialState.QUEUED and trial.started_at is None
        trial.error = (
            "experiment killed before the trial ran" if never_started else "killed by user"
        )
        trial.state = TrialState.NOT_RUN if never_started else TrialState.ERROR
        trial.ended_at = now
    experiment.state = ExperimentState.CANCELED
    experiment.requested_action = None
    experiment.ended_at = now


def _fail_open_optuna_trials(db_url: str, study_name: str) -> None:
    """Tell Optuna FAIL for the study's trials still RUNNING or WAITING (enqueued)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna_storage(db_url)
    open_states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    for frozen in study_trials(db_url, study_name, states=open_states) or []:
        storage.set_trial_state_values(
            optuna_trial_id(db_url, study_name, frozen.number),
            state=optuna.trial.TrialState.FAIL,
        )
