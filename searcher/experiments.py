"""Creating, finding and controlling experiments in the database (the driver's I/O edge)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from searcher.config import ExperimentConfig
from storage import (
    Experiment,
    ExperimentState,
    Trial,
    TrialState,
    optuna_storage,
    session_scope,
    upgrade_schema,
    utcnow,
)

# A driver that has not written its heartbeat for this long is taken as dead.
DRIVER_STALE_AFTER_S = 20.0


class UsageError(Exception):
    """A user mistake the CLI reports as one line with exit code 2."""


def create_experiment(
    config: ExperimentConfig,
    *,
    config_path: Path,
    db_url: str,
    directions: Sequence[Literal["minimize", "maximize"]],
) -> int:
    """Record a new experiment and create its Optuna study; returns the experiment id.

    The study is named ``<name>-<id>`` so names may repeat across experiments while
    ``optuna.load_study(study_name=..., storage=URL)`` still finds exactly one.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        experiment = Experiment(
            name=config.name,
            study_name=f"pending-{os.getpid()}-{utcnow().timestamp()}",
            state=ExperimentState.ACTIVE,
            config=config.model_dump(mode="json"),
            config_path=str(config_path.resolve()),
            model_dir=str(config_path.resolve().parent),
            max_trials=config.searcher.max_trials,
        )
        session.add(experiment)
        session.flush()
        experiment.study_name = f"{config.name}-{experiment.id}"
        experiment_id = experiment.id
        study_name = experiment.study_name
    try:
        optuna.create_study(
            study_name=study_name, storage=optuna_storage(db_url), directions=directions
        )
    except BaseException:
        with session_scope(db_url) as session:
            session.delete(session.get(Experiment, experiment_id))
        raise
    return experiment_id


def find_experiment(session: Session, ref: str) -> Experiment:
    """An experiment by id or by name (the newest of that name)."""
    if ref.isdigit():
        experiment = session.get(Experiment, int(ref))
    else:
        experiment = session.scalars(
            select(Experiment).where(Experiment.name == ref).order_by(Experiment.id.desc())
        ).first()
    if experiment is None:
        raise UsageError(f"experiment: no experiment with id or name '{ref}'")
    return experiment


def driver_alive(experiment: Experiment) -> bool:
    """Whether a driver still owns ``experiment`` (fresh heartbeat, live pid if local)."""
    if experiment.driver_heartbeat_at is None:
        return False
    age = (utcnow() - experiment.driver_heartbeat_at).total_seconds()
    if age > DRIVER_STALE_AFTER_S:
        return False
    if experiment.driver_host == socket.gethostname() and experiment.driver_pid:
        try:
            os.kill(experiment.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


@dataclass(frozen=True)
class TrialCounts:
    total: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    pruned: int = 0
    errored: int = 0

    @property
    def finished(self) -> int:
        return self.completed + self.pruned + self.errored


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
    )


def best_trials(session: Session, experiment: Experiment, limit: int = 5) -> list[Trial]:
    """Completed trials ordered best first by the searcher metric."""
    smaller = bool(experiment.config["searcher"].get("smaller_is_better", True))
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


def request_action(db_url: str, ref: str, action: str) -> Experiment:
    """Ask the driver of an experiment to ``pause`` or ``kill`` it (from any terminal).

    An experiment without a live driver is changed directly.
    """
    with session_scope(db_url) as session:
        experiment = find_experiment(session, ref)
        if experiment.state.is_terminal:
            raise UsageError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is already "
                f"{experiment.state.value}"
            )
        if driver_alive(experiment):
            experiment.requested_action = action
        elif action == "pause":
            experiment.state = ExperimentState.PAUSED
        else:
            experiment.state = ExperimentState.CANCELED
            experiment.ended_at = utcnow()
        return experiment
