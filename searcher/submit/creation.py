"""An experiment's row and its Optuna study, created together; a finished one extended.

The study is named ``<name>-<id>``: names may repeat across experiments, and
``optuna.load_study(study_name=..., storage=URL)`` still finds exactly one. Both are
written before any driver starts, so an experiment never lacks its study.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from searcher.experiments import UsageError, find_experiment
from storage import (
    Experiment,
    ExperimentState,
    optuna_storage,
    session_scope,
    upgrade_schema,
    utcnow,
)
from trials.config import ExperimentConfig, SearcherConfig, read_stored_config
from trials.queries import trial_counts

__all__ = ["create_experiment", "extend_experiment"]


def create_experiment(
    config: ExperimentConfig,
    *,
    config_path: Path | None,
    db_url: str,
    directions: Sequence[Literal["minimize", "maximize"]],
    model_dir: Path | None = None,
) -> int:
    """Record a new experiment and create its Optuna study; returns the experiment id.

    The model directory (where the ranks import the entrypoint) is ``model_dir``, else
    the config file's folder; a config given as a mapping has no file (``config_path``
    None) and names its ``model_dir``.
    The study is named ``<name>-<id>`` so names may repeat across experiments while
    ``optuna.load_study(study_name=..., storage=URL)`` still finds exactly one.
    """
    import optuna

    if model_dir is not None:
        folder = model_dir.resolve()
    elif config_path is not None:
        folder = config_path.resolve().parent
    else:
        raise ValueError("create_experiment: a config without a file needs its model_dir")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        experiment = Experiment(
            name=config.name,
            study_name=f"pending-{os.getpid()}-{utcnow().timestamp()}",
            state=ExperimentState.ACTIVE,
            config=config.model_dump(mode="json"),
            config_path=None if config_path is None else str(config_path.resolve()),
            model_dir=str(folder),
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


def extend_experiment(
    db_url: str, ref: str, *, max_trials: int | None = None, more_trials: int | None = None
) -> tuple[int, ExperimentConfig]:
    """Raise a COMPLETED or PAUSED experiment's trial budget and leave it PAUSED to resume.

    Exactly one of ``max_trials`` (the new total) and ``more_trials`` (added to the
    larger of the old budget and the trials it already has) is given. The experiment
    keeps its Optuna study, so the samplers see every earlier trial and new trials
    number on from the old ones; earlier trials, their metrics and checkpoints are not
    touched. It is left PAUSED, not ACTIVE, because the driver resumes a paused
    experiment as it is and refuses an ended one. Returns the experiment id and its
    config with the new budget (``searcher.max_trials``).
    """
    from pydantic import ValidationError

    from searcher.submit import space

    with session_scope(db_url) as session:
        experiment = find_experiment(session, ref)
        if experiment.state not in (ExperimentState.COMPLETED, ExperimentState.PAUSED):
            hint = (
                f"`slotsweep resume {experiment.id}` continues it"
                if experiment.state == ExperimentState.ACTIVE
                else "start a new experiment instead"
            )
            raise UsageError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is "
                f"{experiment.state.value}; continue extends COMPLETED or PAUSED experiments "
                f"({hint})"
            )
        so_far = trial_counts(session, experiment.id).total
        if max_trials is None:
            assert more_trials is not None
            max_trials = max(experiment.max_trials, so_far) + more_trials
            source = "--more-trials"
        else:
            source = "--max-trials"
        if max_trials <= so_far:
            raise UsageError(
                f"{source}: experiment {experiment.id} already has {so_far} trials; the new "
                f"budget must be more than that, got {max_trials}"
            )
        stored = read_stored_config(experiment.config)
        try:
            searcher = SearcherConfig.model_validate(
                {**stored.searcher.model_dump(), "max_trials": max_trials}
            )
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            raise UsageError(f"{source}: {reason}, got {max_trials}") from None
        parsed = stored.model_copy(update={"searcher": searcher})
        if parsed.searcher.name == "grid" and space.grid_size(parsed.hyperparameters) <= so_far:
            raise UsageError(
                f"{source}: all {so_far} points of experiment {experiment.id}'s grid have "
                "run; a grid search cannot be extended"
            )
        # A new dict (not an in-place change) so SQLAlchemy sees the JSON column change.
        experiment.config = parsed.model_dump(mode="json")
        experiment.max_trials = max_trials
        experiment.state = ExperimentState.PAUSED
        experiment.ended_at = None
        experiment.requested_action = None
        return experiment.id, parsed
