"""Optuna's own plots of an experiment's study, with plain reasons when one cannot be drawn.

The figures come from :mod:`optuna.visualization` (plotly). Optuna's plot functions
need every trial of the study, so the UI reads the study once into an in-memory copy
(:func:`snapshot_study`) and draws every plot from that copy; the page caches the copy
and the figures until the study changes.

Example:
    >>> study = snapshot_study(url, "digits-large-batch-1")
    >>> figure, reason = make_plot(study, "Optimization history", ["val_loss"])
    >>> figure, reason  # the study's one trial is still running
    (None, 'No trial has completed yet, so there is nothing to draw the Optimization history from.')
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from storage import read_study

if TYPE_CHECKING:
    import optuna
    from plotly.graph_objects import Figure

HISTORY = "Optimization history"
IMPORTANCES = "Parameter importances"
PARALLEL = "Parallel coordinates"
INTERMEDIATE = "Intermediate values"
SLICE = "Slice"
CONTOUR = "Contour"
EDF = "Empirical distribution"
RANK = "Rank"
TIMELINE = "Timeline"
PARETO = "Pareto front"
SINGLE_OBJECTIVE_PLOTS = (
    HISTORY,
    IMPORTANCES,
    PARALLEL,
    INTERMEDIATE,
    SLICE,
    CONTOUR,
    EDF,
    RANK,
    TIMELINE,
)
# Plots that read only the completed trials; the others change with every report.
COMPLETED_ONLY_PLOTS = (HISTORY, IMPORTANCES, PARALLEL, SLICE, CONTOUR, EDF, RANK, PARETO)
# Fewer completed trials than this and fANOVA's forest ranks noise: Optuna's own
# importance evaluators need a handful of trials before the ranking means anything.
MIN_TRIALS_FOR_IMPORTANCES = 5
# Optuna draws objective values on "Blues", whose worst end is near-white on a white
# page. Plasma stopped before its yellow end keeps every value at least 2:1 against
# white while staying readable by colour-blind users.
CONTRAST_SAFE_SCALE = [
    [0.0, "#0d0887"],
    [0.25, "#6a00a8"],
    [0.5, "#b12a90"],
    [0.75, "#e16462"],
    [1.0, "#f2844b"],
]


def available_plots(n_objectives: int) -> tuple[str, ...]:
    """The plots that make sense for a study with ``n_objectives`` objectives."""
    return (*SINGLE_OBJECTIVE_PLOTS, PARETO) if n_objectives > 1 else SINGLE_OBJECTIVE_PLOTS


def snapshot_study(url: str, study_name: str) -> optuna.Study:
    """An in-memory copy of a stored study, read in one short read-only transaction.

    The trials come from :func:`storage.read_study` (plain SELECTs over Optuna's tables
    at a schema revision it knows: Optuna's RDBStorage builds an ORM object per row,
    16,000 for 1,000 trials with ten reports each); the plots then run on the copy.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stored = read_study(url, study_name)
    memory = optuna.storages.InMemoryStorage()
    snapshot = optuna.create_study(
        study_name=study_name, directions=stored.directions, storage=memory
    )
    # Straight into the storage: Study.add_trials validates each trial again, and the
    # trials come from Optuna's own tables (or its own storage), valid already.
    study_id = memory.get_study_id_from_name(study_name)
    for trial in stored.trials:
        memory.create_new_trial(study_id, template_trial=trial)
    if stored.metric_names is not None:
        with warnings.catch_warnings():
            # Experimental since Optuna 3.2; the plots only need the names.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            snapshot.set_metric_names(stored.metric_names)
    return snapshot


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


def searched_params(study: optuna.Study) -> list[str]:
    """The parameters the completed trials searched, in first-seen order, for pickers."""
    from optuna.trial import TrialState

    names: dict[str, None] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        names.update(dict.fromkeys(trial.distributions))
    return list(names)


def plot_caption(study: optuna.Study, kind: str) -> str | None:
    """What a drawn plot rests on, where the figure alone does not say it."""
    from optuna.trial import TrialState

    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if kind == IMPORTANCES:
        return (
            f"Importances (fANOVA) rest on {complete} completed trials; pruned, failed "
            "and running trials have no final value and are left out."
        )
    if kind in (PARALLEL, INTERMEDIATE) and len(study.trials) > LINE_TRIALS:
        stride = _stride(len(study.trials))
        return (
            f"Lines of one trial in {stride} by number (plus the best) of "
            f"{len(study.trials):,}: more lines would only cover each other."
        )
    if kind in (SLICE, CONTOUR, RANK, EDF, PARALLEL, HISTORY):
        return f"Drawn from the {complete} completed trials."
    if kind == TIMELINE:
        shown = min(len(study.trials), TIMELINE_TRIALS)
        return f"The {shown} most recent of {len(study.trials)} trials, by state."
    return None


# The timeline draws one bar per trial; past this many the bars are unreadable anyway.
TIMELINE_TRIALS = 500
# Parallel coordinates and intermediate values draw one plotly trace per trial (about
# 0.5 ms each, 10 s for 10,000 trials): past this many, a sample is drawn.
LINE_TRIALS = 1000


def _stride(n_trials: int) -> int:
    return -(-n_trials // LINE_TRIALS)


def _line_sample(study: optuna.Study) -> optuna.Study:
    """``study`` itself, or past :data:`LINE_TRIALS` trials a copy holding one trial in
    ``n`` by number and the best trial (so the plots that draw a line per trial stay fast)."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    if len(trials) <= LINE_TRIALS:
        return study
    stride = _stride(len(trials))
    complete = any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    best = {t.number for t in study.best_trials} if complete else set()
    kept = [t for t in trials if t.number % stride == 0 or t.number in best]
    memory = optuna.storages.InMemoryStorage()
    sample = optuna.create_study(
        study_name=study.study_name, directions=study.directions, storage=memory
    )
    study_id = memory.get_study_id_from_name(study.study_name)
    for trial in kept:
        memory.create_new_trial(study_id, template_trial=trial)
    # The storage numbers its trials 0..n-1; the plots label lines with the real numbers.
    for stored, original in zip(
        memory.get_all_trials(study_id, deepcopy=False), kept, strict=True
    ):
        stored.number = original.number
    return sample


def make_plot(
    study: optuna.Study,
    kind: str,
    names: Sequence[str],
    params: Sequence[str] | None = None,
) -> tuple[Figure | None, str | None]:
    """Optuna's figure for ``kind``, or ``(None, reason)`` when the study cannot show it yet.

    ``params`` limits the slice, contour and rank plots to those parameters (contour and
    rank draw a grid of every pair, so the page picks a few); ``None`` means all.
    """
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import (
        plot_contour,
        plot_edf,
        plot_intermediate_values,
        plot_optimization_history,
        plot_parallel_coordinate,
        plot_param_importances,
        plot_pareto_front,
        plot_rank,
        plot_slice,
        plot_timeline,
    )

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    multi = len(study.directions) > 1
    # For a multi-objective study the single-objective plots show the first objective.
    target: Callable[[optuna.trial.FrozenTrial], float] | None = (
        (lambda t: t.values[0]) if multi else None
    )
    target_name = names[0] if names else "Objective Value"
    chosen = list(params) if params else None
    per_param = (SLICE, CONTOUR, RANK)

    if kind == TIMELINE:
        if not trials:
            return None, "No trial has started yet, so there is no timeline."
        return plot_timeline(study, n_recent_trials=TIMELINE_TRIALS), None
    if kind == INTERMEDIATE:
        if multi:
            return None, "Intermediate values are reported only by single-objective studies."
        if not any(t.intermediate_values for t in trials):
            return None, "No trial has reported an intermediate (validation) value yet."
        return plot_intermediate_values(_line_sample(study)), None
    if kind == PARETO:
        if not multi:
            return None, "The Pareto front needs a multi-objective study."
        if not complete:
            return None, _nothing_completed(trials, "no Pareto front")
        return plot_pareto_front(study, target_names=list(names)), None
    if kind not in SINGLE_OBJECTIVE_PLOTS:
        raise ValueError(f"kind: must be one of {', '.join(available_plots(2))}, got {kind!r}")
    if not complete:
        return None, _nothing_completed(trials, f"nothing to draw the {kind} from")
    if kind in per_param and not any(t.distributions for t in complete):
        return None, "The completed trials have no searched parameters to plot."
    if kind in (CONTOUR, RANK) and chosen is not None and len(chosen) < 2:
        return None, f"The {kind} plot needs at least 2 parameters; pick another."

    figure: Figure
    if kind == HISTORY:
        figure = plot_optimization_history(study, target=target, target_name=target_name)
    elif kind == IMPORTANCES:
        if len(complete) < MIN_TRIALS_FOR_IMPORTANCES:
            return None, (
                f"Parameter importances need at least {MIN_TRIALS_FOR_IMPORTANCES} completed "
                f"trials to mean anything; this study has {len(complete)}."
            )
        if not any(t.distributions for t in complete):
            return None, "The completed trials have no searched parameters to rank."
        try:
            figure = plot_param_importances(study, target=target, target_name=target_name)
        except (ValueError, RuntimeError) as exc:
            # e.g. every completed trial has the same parameter values.
            return None, f"Optuna could not compute parameter importances: {exc}"
    elif kind == PARALLEL:
        figure = plot_parallel_coordinate(
            _line_sample(study), target=target, target_name=target_name
        )
    elif kind == EDF:
        figure = plot_edf(study, target=target, target_name=target_name)
    else:
        draw = {SLICE: plot_slice, CONTOUR: plot_contour, RANK: plot_rank}[kind]
        with warnings.catch_warnings():
            # plot_rank is experimental since Optuna 3.2; its figure is what we want.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            figure = draw(study, params=chosen, target=target, target_name=target_name)
    return _with_contrast(figure), None


def _nothing_completed(trials: Sequence[optuna.trial.FrozenTrial], consequence: str) -> str:
    """Why a plot of completed trials is empty: not yet, or never (every trial ended otherwise)."""
    from optuna.trial import TrialState

    if trials and all(t.state.is_finished() for t in trials):
        failed = sum(t.state == TrialState.FAIL for t in trials)
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        return (
            f"No trial completed ({failed} failed, {pruned} pruned of {len(trials)}), "
            f"so there is {consequence}."
        )
    return f"No trial has completed yet, so there is {consequence}."


def _from_blues(colour: str) -> str:
    """A colour sampled from plotly's "Blues", re-sampled at its position on the safe scale."""
    from plotly.colors import sample_colorscale, unlabel_rgb

    if not colour.startswith("rgb("):
        return colour
    red = float(unlabel_rgb(colour)[0])
    # Blues' red channel falls monotonically from 247 (position 0) to 8 (position 1).
    position = min(1.0, max(0.0, (247.0 - red) / (247.0 - 8.0)))
    return str(sample_colorscale(CONTRAST_SAFE_SCALE, [position])[0])


def _with_contrast(figure: Figure) -> Figure:
    """``figure`` with every continuous colour scale replaced by :data:`CONTRAST_SAFE_SCALE`.

    Optuna's parallel-coordinate plot colours each trial's line itself, sampled from
    "Blues"; such a colour is mapped to the same position of the safe scale.
    """
    for trace in figure.data:
        line = getattr(trace, "line", None)
        if line is not None and getattr(line, "colorscale", None) is not None:
            line.colorscale = CONTRAST_SAFE_SCALE
        elif line is not None and isinstance(getattr(line, "color", None), str):
            line.color = _from_blues(line.color)
        marker = getattr(trace, "marker", None)
        if marker is not None and getattr(marker, "colorscale", None) is not None:
            marker.colorscale = CONTRAST_SAFE_SCALE
        if getattr(trace, "type", None) == "contour":
            trace.colorscale = CONTRAST_SAFE_SCALE
    return figure
