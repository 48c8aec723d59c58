"""Finding, counting and controlling recorded experiments: what every part of searcher shares.

An experiment is named on the command line, in the API and in the UI by its id or its
name (:func:`find_experiment`); a mistake there is a :class:`UsageError`, which the CLI
prints as one line with exit code 2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    Trial,
    TrialState,
    session_scope,
)
from trials import pruning
from trials.config import read_stored_config
from trials.coordination import control
from trials.coordination.cluster_queue import queue_view, waiting_reason
from trials.coordination.control import driver_alive
from trials.labels import trial_label

__all__ = [
    "TrialCounts",
    "UsageError",
    "best_trials",
    "describe_front",
    "describe_rows",
    "driver_alive",
    "experiment_rows",
    "find_experiment",
    "request_action",
    "trial_counts",
]


class UsageError(Exception):
    """A user mistake the CLI reports as one line with exit code 2."""


def find_experiment(session: Session, ref: str) -> Experiment:
    """An experiment by id, or by a name that exactly one experiment has.

    Names may repeat (every run of a config takes its name), so a name several
    experiments share is refused with their ids rather than silently picking one.
    """
    if ref.isdigit():
        experiment = session.get(Experiment, int(ref))
    else:
        matches = list(
            session.scalars(
                select(Experiment).where(Experiment.name == ref).order_by(Experiment.id)
            )
        )
        if len(matches) > 1:
            ids = ", ".join(str(m.id) for m in matches)
            raise UsageError(
                f"experiment: {len(matches)} experiments are named '{ref}' (ids {ids}); "
                "give one of the ids"
            )
        experiment = matches[0] if matches else None
    if experiment is None:
        raise UsageError(f"experiment: no experiment with id or name '{ref}'")
    return experiment


@dataclass(frozen=True)
class TrialCounts:
    total: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    pruned: int = 0
    errored: int = 0
    #: Asked, never started, ended when the experiment was killed or stopped (no failure).
    not_run: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.pruned + self.errored


def trial_total(session: Session, experiment_id: int) -> int:
    """How many trials the experiment has, in any state.

    One count over the experiment's index, without reading a row: the driver asks it
    before every new trial, where :func:`trial_counts`' count per state reads every
    trial's row (6 ms of SQLite at 10,000 trials against 0.6 ms).
    """
    return int(
        session.scalar(
            select(func.count()).select_from(Trial).where(Trial.experiment_id == experiment_id)
        )
        or 0
    )


def trial_counts(session: Session, experiment_id: int) -> TrialCounts:
    rows = session.execute(
        select(Trial.state, func.count())
        .where(Trial.experiment_id == experiment_id)
        .group_by(Trial.state)
    ).all()
    by_state: dict[Any, int] = {state: count for state, count in rows}
    return TrialCounts(
        total=sum(by_state.values()),
        queued=by_state.get(TrialState.QUEUED, 0),
        running=by_state.get(TrialState.RUNNING, 0),
        completed=by_state.get(TrialState.COMPLETED, 0),
        pruned=by_state.get(TrialState.PRUNED, 0),
        errored=by_state.get(TrialState.ERROR, 0),
        not_run=by_state.get(TrialState.NOT_RUN, 0),
    )


def best_trials(session: Session, experiment: Experiment, limit: int = 5) -> list[Trial]:
    """Completed trials ordered best first by the searcher metric."""
    smaller = read_stored_config(experiment.config).searcher.smaller_is_better
    value = Trial.searcher_metric_value
    return list(
        session.scalars(
            select(Trial)
            .where(
                Trial.experiment_id == experiment.id,
                Trial.state == TrialState.COMPLETED,
                value.is_not(None),
            )
            .order_by(value.asc() if smaller else value.desc(), Trial.id)
            .limit(limit)
        )
    )


def request_action(db_url: str, ref: str, action: control.Action) -> str:
    """``pause``, ``activate`` or ``kill`` the experiment ``ref`` (id or name), from any terminal.

    Resolves ``ref`` as every command does, then takes the one path the UI also takes
    (:func:`trials.coordination.control.request_action`); returns what happened, in words.
    """
    with session_scope(db_url) as session:
        experiment_id = find_experiment(session, ref).id
    try:
        return control.request_action(db_url, experiment_id, action)
    except control.ActionRefused as exc:
        raise UsageError(f"experiment: {exc}") from None


def experiment_rows(session: Session) -> list[dict[str, Any]]:
    """One row per experiment: state, trial counts and the best searcher metric value."""
    rows = []
    for experiment in session.scalars(select(Experiment).order_by(Experiment.id)):
        counts = trial_counts(session, experiment.id)
        best = best_trials(session, experiment, limit=1)
        rows.append(
            {
                "id": experiment.id,
                "name": experiment.name,
                "state": experiment.state.value,
                "trials": counts.total,
                "max_trials": experiment.max_trials,
                "running": counts.running,
                "completed": counts.completed,
                "pruned": counts.pruned,
                "failed": counts.errored,
                "metric": read_stored_config(experiment.config).searcher.metric,
                "best": best[0].searcher_metric_value if best else None,
            }
        )
    return rows


def describe_rows(session: Session, experiment: Experiment) -> dict[str, Any]:
    """The experiment and each of its trials, numbered as Optuna numbers them."""
    latest = (
        select(Checkpoint.trial_id, func.max(Checkpoint.step).label("step"))
        .where(Checkpoint.state == CheckpointState.COMPLETED)
        .group_by(Checkpoint.trial_id)
        .subquery()
    )
    found = session.execute(
        select(Trial, latest.c.step)
        .outerjoin(latest, latest.c.trial_id == Trial.id)
        .where(Trial.experiment_id == experiment.id)
        .order_by(Trial.optuna_trial_number)
    ).all()
    metric = read_stored_config(experiment.config).searcher.metric
    queued = {view.trial_id: view for view in queue_view(session, experiment_id=experiment.id)}
    skipped = _skipped_checkpoints(session, experiment.id)
    trials = [
        {
            "trial": trial_label(experiment.id, trial.optuna_trial_number),
            "number": trial.optuna_trial_number,
            "state": trial.state.value,
            metric: trial.searcher_metric_value,
            "batches": trial.total_batches,
            "restarts": trial.restarts,
            "slot_seconds": trial.slot_seconds,
            "checkpoint_step": step,
            "hyperparameters": dict(trial.hparams),
            "error": trial.error,
            "waiting_reason": (
                waiting_reason(queued.get(trial.id), experiment.state)
                if trial.state == TrialState.QUEUED
                else None
            ),
            "skipped_checkpoints": skipped.get(trial.id, []),
        }
        for trial, step in found
    ]
    return {
        "id": experiment.id,
        "name": experiment.name,
        "state": experiment.state.value,
        "metric": metric,
        "max_trials": experiment.max_trials,
        # Its folder under checkpoint_storage.path: ``<id>-<key>``, not to be guessed.
        "checkpoint_folder": experiment.checkpoint_folder,
        "trials": trials,
    }


def describe_front(db_url: str, experiment: Experiment) -> dict[str, Any]:
    """A multi-objective experiment's Pareto front so far and where its pruned trials stopped.

    ``pareto_front``: the completed trials no other completed trial dominates, with the
    values Optuna was told (the searcher metric, then each cost objective), best metric
    first. ``pruned_at``: each trial the pruner stopped, at its rung: the rung, how far
    the trial had come (``step`` of the pruner's ``unit``, as Optuna counts it) and its
    values there. Both empty
    for a single-objective experiment (:func:`trials.pruning.pareto_summary`).
    """
    searcher = read_stored_config(experiment.config).searcher
    summary = pruning.pareto_summary(db_url, experiment.study_name, searcher)
    names, unit = summary.objectives, searcher.resource_unit
    return {
        "objectives": names,
        "pareto_front": [
            {
                "trial": trial_label(experiment.id, number),
                "number": number,
                **dict(zip(names, values, strict=True)),
            }
            for number, values in summary.front
        ],
        "pruned_at": [
            {
                "trial": trial_label(experiment.id, stop.trial_number),
                "number": stop.trial_number,
                "rung": stop.rung,
                # In the pruner's unit: Optuna's hundredths of a slot-second, or epochs/batches.
                "step": stop.step,
                "unit": unit,
                **dict(zip(names, stop.values, strict=True)),
            }
            for stop in summary.stops
        ],
    }


def _skipped_checkpoints(session: Session, experiment_id: int) -> dict[int, list[dict[str, Any]]]:
    """Per trial id, its CORRUPTED checkpoints (newest first): uuid, step, path, problem."""
    rows = session.scalars(
        select(Checkpoint)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id == experiment_id, Checkpoint.state == CheckpointState.CORRUPTED)
        .order_by(Checkpoint.step.desc(), Checkpoint.id.desc())
    )
    found: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        found.setdefault(row.trial_id, []).append(
            {"uuid": row.uuid, "step": row.step, "path": row.path, "problem": row.problem}
        )
    return found
