"""Optuna's own plots of an experiment's study, with plain reasons when one cannot be drawn.

The figures come from :mod:`optuna.visualization` (plotly). Optuna's plot functions
read every trial of the study, so the UI reads the study once into an in-memory copy
(:func:`snapshot_study`) and draws every plot from that copy; the page caches the copy
until the study changes.

Example:
    >>> study = snapshot_study("sqlite:///slotsweep.db", "digits-1")  # doctest: +SKIP
    >>> figure, reason = make_plot(study, "Optimization history", ["val_loss"])  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
    """An in-memory copy of a stored study, read through a read-only storage.

    Reading once and plotting from the copy keeps Optuna from re-reading every trial
    for each plot, and keeps the read transaction short.
    """
    import optuna

    from storage import optuna_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = optuna.load_study(study_name=study_name, storage=optuna_storage(url, read_only=True))
    copy = optuna.create_study(
        study_name=study_name,
        directions=stored.directions,
        storage=optuna.storages.InMemoryStorage(),
    )
    copy.add_trials(stored.get_trials(deepcopy=False))
    if stored.metric_names is not None:
        with warnings.catch_warnings():
            # Experimental since Optuna 3.2; the plots only need the names.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            copy.set_metric_names(stored.metric_names)
    return copy


def objective_names(study: optuna.Study, primary_metric: str, extra: Sequence[str] = ()) -> list[str]:
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
    import optuna
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
