"""Optuna's own plots of an experiment's study, with plain reasons when one cannot be drawn.

The figures come from :mod:`optuna.visualization` (plotly). Optuna's plot functions
need every trial of the study, so the UI reads the study once into an in-memory copy
(:func:`snapshot_study`) and draws every plot from that copy; the page caches the copy
and the figures until the study changes.

Example:
    >>> study = snapshot_study("sqlite:///slotsweep.db", "digits-1")  # doctest: +SKIP
    >>> figure, reason = make_plot(study, "Optimization history", ["val_loss"])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from storage import optuna_storage

if TYPE_CHECKING:
    import optuna
    from plotly.graph_objects import Figure

HISTORY = "Optimization history"
IMPORTANCES = "Parameter importances"
PARALLEL = "Parallel coordinates"
INTERMEDIATE = "Intermediate values"
PARETO = "Pareto front"
SINGLE_OBJECTIVE_PLOTS = (HISTORY, IMPORTANCES, PARALLEL, INTERMEDIATE)


def available_plots(n_objectives: int) -> tuple[str, ...]:
    """The plots that make sense for a study with ``n_objectives`` objectives."""
    return (*SINGLE_OBJECTIVE_PLOTS, PARETO) if n_objectives > 1 else SINGLE_OBJECTIVE_PLOTS


def snapshot_study(url: str, study_name: str) -> optuna.Study:
    """An in-memory copy of a stored study, read in one short read-only transaction.

    Optuna's RDBStorage builds an ORM object per row (16,000 for 1,000 trials with ten
    reports each: 0.5 s on an idle 2-core machine, 2 s on a busy one). The copy is
    built instead from four plain SELECTs over Optuna's tables and Optuna's own
    ``create_trial``; the plots then run on the copy. Should Optuna's schema ever
    differ, the copy is read through Optuna's storage instead.
    """
    import optuna
    import sqlalchemy.exc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        directions, metric_names, trials = _read_study_tables(url, study_name)
    except (sqlalchemy.exc.SQLAlchemyError, KeyError, ValueError):
        stored = optuna.load_study(
            study_name=study_name, storage=optuna_storage(url, read_only=True)
        )
        directions, metric_names = stored.directions, stored.metric_names
        trials = stored.get_trials(deepcopy=False)
    copy = optuna.create_study(
        study_name=study_name, directions=directions, storage=optuna.storages.InMemoryStorage()
    )
    copy.add_trials(trials)
    if metric_names is not None:
        with warnings.catch_warnings():
            # Experimental since Optuna 3.2; the plots only need the names.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            copy.set_metric_names(metric_names)
    return copy


_SPECIAL_VALUES = {"INF_POS": math.inf, "INF_NEG": -math.inf, "NAN": math.nan}


def _stored_float(value: float | None, value_type: str) -> float:
    return (
        float(value)
        if value_type == "FINITE" and value is not None
        else _SPECIAL_VALUES[value_type]
    )


def _read_study_tables(
    url: str, study_name: str
) -> tuple[list[optuna.study.StudyDirection], list[str] | None, list[optuna.trial.FrozenTrial]]:
    """The study's directions, metric names and trials, straight from Optuna's tables."""
    import sqlalchemy as sa
    from optuna.distributions import json_to_distribution
    from optuna.study import StudyDirection
    from optuna.trial import TrialState, create_trial

    from storage import get_engine

    by_trial = "FROM {table} x JOIN trials t ON t.trial_id = x.trial_id WHERE t.study_id = :sid"
    with get_engine(url, read_only=True).connect() as conn:
        study_id = conn.execute(
            sa.text("SELECT study_id FROM studies WHERE study_name = :name"), {"name": study_name}
        ).scalar_one()
        sid = {"sid": study_id}
        directions = [
            StudyDirection[name]
            for (name,) in conn.execute(
                sa.text(
                    "SELECT direction FROM study_directions WHERE study_id = :sid ORDER BY objective"
                ),
                sid,
            )
        ]
        names_json = conn.execute(
            sa.text(
                "SELECT value_json FROM study_system_attributes"
                " WHERE study_id = :sid AND key = 'study:metric_names'"
            ),
            sid,
        ).scalar()
        trial_rows = conn.execute(
            sa.text(
                "SELECT trial_id, number, state FROM trials WHERE study_id = :sid ORDER BY number"
            ),
            sid,
        ).all()
        params = conn.execute(
            sa.text(
                "SELECT x.trial_id, x.param_name, x.param_value, x.distribution_json "
                + by_trial.format(table="trial_params")
            ),
            sid,
        ).all()
        values = conn.execute(
            sa.text(
                "SELECT x.trial_id, x.objective, x.value, x.value_type "
                + by_trial.format(table="trial_values")
            ),
            sid,
        ).all()
        reports = conn.execute(
            sa.text(
                "SELECT x.trial_id, x.step, x.intermediate_value, x.intermediate_value_type "
                + by_trial.format(table="trial_intermediate_values")
            ),
            sid,
        ).all()
        constraints = conn.execute(
            sa.text(
                "SELECT x.trial_id, x.value_json "
                + by_trial.format(table="trial_system_attributes")
                + " AND x.key = 'constraints'"
            ),
            sid,
        ).all()
    distributions: dict[str, Any] = {}  # Parsed once per distinct JSON, not once per row.
    trial_params: dict[int, dict[str, Any]] = {}
    trial_distributions: dict[int, dict[str, Any]] = {}
    for trial_id, name, internal, dist_json in params:
        dist = distributions.get(dist_json) or distributions.setdefault(
            dist_json, json_to_distribution(dist_json)
        )
        trial_params.setdefault(trial_id, {})[name] = dist.to_external_repr(internal)
        trial_distributions.setdefault(trial_id, {})[name] = dist
    trial_values: dict[int, dict[int, float]] = {}
    for trial_id, objective, value, value_type in values:
        trial_values.setdefault(trial_id, {})[objective] = _stored_float(value, value_type)
    trial_reports: dict[int, dict[int, float]] = {}
    for trial_id, step, value, value_type in reports:
        trial_reports.setdefault(trial_id, {})[step] = _stored_float(value, value_type)
    trial_constraints = {trial_id: json.loads(text) for trial_id, text in constraints}
    trials = []
    for position, (trial_id, number, state) in enumerate(trial_rows):
        if number != position:
            raise ValueError(f"trial numbers are not contiguous at {number}")
        objective_values = trial_values.get(trial_id)
        trials.append(
            create_trial(
                state=TrialState[state],
                values=[objective_values[i] for i in sorted(objective_values)]
                if objective_values
                else None,
                params=trial_params.get(trial_id, {}),
                distributions=trial_distributions.get(trial_id, {}),
                system_attrs=(
                    {"constraints": trial_constraints[trial_id]}
                    if trial_id in trial_constraints
                    else None
                ),
                intermediate_values=trial_reports.get(trial_id),
            )
        )
    return directions, (json.loads(names_json) if names_json else None), trials


def preload_importance_backend() -> None:
    """Import scikit-learn, whose random forest Optuna's fANOVA importances use.

    The import alone takes 1-4 s on a 2-core machine; the Experiment page starts it in
    the background so the first importance plot does not pay it.
    """
    import sklearn.ensemble  # noqa: F401


def objective_names(
    study: optuna.Study, primary_metric: str, extra: Sequence[str] = ()
) -> list[str]:
    """Names of the study's objectives: Optuna's metric names if set, else the config's."""
    if study.metric_names is not None:
        return list(study.metric_names)
    names = [primary_metric, *extra]
    n = len(study.directions)
    return names[:n] + [f"objective {i}" for i in range(len(names), n)]


def make_plot(
    study: optuna.Study, kind: str, names: Sequence[str]
) -> tuple[Figure | None, str | None]:
    """Optuna's figure for ``kind``, or ``(None, reason)`` when the study cannot show it yet."""
    from optuna.trial import TrialState
    from optuna.visualization import (
        plot_intermediate_values,
        plot_optimization_history,
        plot_parallel_coordinate,
        plot_param_importances,
        plot_pareto_front,
    )

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    multi = len(study.directions) > 1
    # For a multi-objective study the single-objective plots show the first objective.
    target: Callable[[optuna.trial.FrozenTrial], float] | None = (
        (lambda t: t.values[0]) if multi else None
    )
    target_name = names[0] if names else "Objective Value"

    if kind == HISTORY:
        if not complete:
            return None, "No trial has completed yet, so there is no history to plot."
        return plot_optimization_history(study, target=target, target_name=target_name), None
    if kind == IMPORTANCES:
        if len(complete) < 2:
            return None, (
                f"Parameter importances need at least 2 completed trials; "
                f"this study has {len(complete)}."
            )
        if not any(t.distributions for t in complete):
            return None, "The completed trials have no searched parameters to rank."
        try:
            return plot_param_importances(study, target=target, target_name=target_name), None
        except (ValueError, RuntimeError) as exc:
            # e.g. every completed trial has the same parameter values.
            return None, f"Optuna could not compute parameter importances: {exc}"
    if kind == PARALLEL:
        if not complete:
            return None, "No trial has completed yet, so there is nothing to compare."
        return plot_parallel_coordinate(study, target=target, target_name=target_name), None
    if kind == INTERMEDIATE:
        if multi:
            return None, "Intermediate values are reported only by single-objective studies."
        if not any(t.intermediate_values for t in trials):
            return None, "No trial has reported an intermediate (validation) value yet."
        return plot_intermediate_values(study), None
    if kind == PARETO:
        if not multi:
            return None, "The Pareto front needs a multi-objective study."
        if not complete:
            return None, "No trial has completed yet, so there is no Pareto front."
        return plot_pareto_front(study, target_names=list(names)), None
    raise ValueError(f"kind: must be one of {', '.join(available_plots(2))}, got {kind!r}")
