"""Optuna samplers, pruners and study directions from an experiment's ``searcher`` section.

Pure construction, no I/O; Optuna is imported only when a function is called, so
commands that never search do not pay for it.

Resuming a search (:func:`build_sampler` with ``trials_so_far``): samplers that learn
from the study (TPE, GP, CMA-ES, NSGA-II, Grid) read its stored trials, so they already
count the finished start-up trials and model every result. What is lost with the
driver is the random number generator's position. Seeding the new sampler with the
config's seed again would replay the first trials' random proposals; instead the seed
is derived from ``(seed, trials_so_far)`` by NumPy's ``SeedSequence``, so a resumed
search is still reproducible (same seed, same trials in the database, same proposals)
and never re-proposes the random sequence it already ran. Grid is the exception: its
seed fixes the shuffled order of the grid that stored trials' grid ids refer to, so it
keeps the config's seed (a running grid trial's number picks its point).

Example:
    >>> from trials.config import parse_config
    >>> cfg = parse_config({
    ...     "name": "demo", "entrypoint": "model:Trial",
    ...     "hyperparameters": {"global_batch_size": 64,
    ...                         "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1}},
    ...     "searcher": {"name": "tpe", "metric": "val_loss", "max_trials": 8, "seed": 0,
    ...                  "max_length": {"epochs": 4},
    ...                  "pruner": {"name": "asha", "min_resource": 1}},
    ... })
    >>> type(build_sampler(cfg)).__name__, type(build_pruner(cfg)).__name__
    ('TPESampler', 'SuccessiveHalvingPruner')
    >>> study_directions(cfg)
    ['minimize']
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from searcher.submit.space import grid_search_space
from trials import PrunerSpec, pruning
from trials.config import ExperimentConfig, slot_seconds_step

if TYPE_CHECKING:
    import optuna

Direction = Literal["minimize", "maximize"]

# Optuna's NSGA-II population; smaller searches get a smaller one (see _population_size).
_NSGA2_MAX_POPULATION = 50
_NSGA2_MIN_POPULATION = 4
_NSGA2_MIN_GENERATIONS = 4
# Optuna's default for CMA-ES, used when the config does not set n_startup_trials:
# CMA-ES starts from the centre of the space, so random start-up trials teach it nothing.
_CMAES_DEFAULT_STARTUP = 1


def build_sampler(
    config: ExperimentConfig, *, trials_so_far: int = 0
) -> optuna.samplers.BaseSampler:
    """The sampler ``searcher.name`` asks for, seeded from ``searcher.seed``.

    - random: ``RandomSampler``.
    - grid: ``GridSampler`` over :func:`searcher.submit.space.grid_search_space`. It does not
      call ``study.stop()`` when the grid is done (Optuna's raises ``RuntimeError`` from
      ``study.tell`` outside ``study.optimize``); the driver stops after
      :func:`searcher.submit.space.grid_size` trials.
    - tpe: multivariate ``TPESampler`` with ``n_startup_trials``; ``constant_liar``
      when ``max_concurrent_trials > 1`` or with warm workers (``reuse_workers``: a warm
      job's next trial is asked while its current one runs), so running trials count as
      bad results and concurrent trials get different suggestions.
    - cmaes: ``CmaEsSampler``; categorical hyperparameters, which CMA-ES cannot model,
      are drawn by its independent ``RandomSampler`` (Optuna's fallback).
    - gp: ``GPSampler`` (scipy and torch) with ``n_startup_trials``.
    - nsga2: ``NSGAIISampler``; population ``clamp(max_trials // 4, 4, 50)`` so a search
      sees at least four generations (Optuna's 50 would make a 32-trial search random).

    ``trials_so_far`` is the number of trials already in the study when a search is
    resumed; it shifts the seed (module docstring).

    Example:
        >>> from trials.config import parse_config
        >>> cfg = parse_config({
        ...     "name": "demo", "entrypoint": "model:Trial",
        ...     "hyperparameters": {"global_batch_size": 64},
        ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2,
        ...                  "seed": 7, "max_length": {"epochs": 1}},
        ... })
        >>> build_sampler(cfg, trials_so_far=5)  # doctest: +ELLIPSIS
        <optuna.samplers._random.RandomSampler object at ...>
    """
    import optuna

    searcher = config.searcher
    seed = _session_seed(searcher.seed, trials_so_far)
    if searcher.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if searcher.name == "grid":
        grid_sampler = _driver_grid_sampler_class()
        return grid_sampler(grid_search_space(config.hyperparameters), seed=searcher.seed)
    if searcher.name == "tpe":
        return optuna.samplers.TPESampler(
            n_startup_trials=searcher.n_startup_trials,
            multivariate=True,
            constant_liar=searcher.max_concurrent_trials > 1 or config.resources.reuse_workers,
            seed=seed,
        )
    if searcher.name == "cmaes":
        startup = (
            searcher.n_startup_trials
            if "n_startup_trials" in searcher.model_fields_set
            else _CMAES_DEFAULT_STARTUP
        )
        return optuna.samplers.CmaEsSampler(
            n_startup_trials=startup,
            seed=seed,
            # Otherwise every trial logs a warning per categorical hyperparameter.
            warn_independent_sampling=False,
        )
    if searcher.name == "gp":
        return optuna.samplers.GPSampler(
            n_startup_trials=searcher.n_startup_trials,
            seed=seed,
            warn_independent_sampling=False,
        )
    assert searcher.name == "nsga2", searcher.name
    return optuna.samplers.NSGAIISampler(
        population_size=_population_size(searcher.max_trials), seed=seed
    )


def pruner_spec(config: ExperimentConfig) -> PrunerSpec | None:
    """The pruner as class name and arguments, or None for ``pruner.name: none``.

    Each trial's rank 0 rebuilds the pruner from this (Optuna does not store it).
    Steps, ``min_resource`` and ``max_resource`` are in the pruner's resource unit,
    which is what the runtime reports as the step: ``searcher.max_length``'s (epochs or
    batches), or with ``pruner.resource: slot_seconds`` the slot-seconds the trial has
    spent, in Optuna's integer steps (:data:`trials.config.STEPS_PER_SLOT_SECOND` to
    the slot-second).

    - asha: ``SuccessiveHalvingPruner(min_resource, reduction_factor,
      min_early_stopping_rate)``.
    - hyperband: ``HyperbandPruner(min_resource, max_resource=max_length,
      reduction_factor)``.
    - median: ``MedianPruner(n_startup_trials, n_warmup_steps + 1)``. The runtime's
      first step is 1 (one epoch or batch completed), Optuna's warm-up counts from
      step 0, so ``n_warmup_steps: 2`` keeps two completed epochs from being pruned.

    With ``searcher.objectives`` asha and hyperband are :mod:`trials.pruning`'s
    ``ParetoSuccessiveHalvingPruner`` and ``ParetoHyperbandPruner`` with the same
    arguments: each rung ranks its trials over the metric and the cost objectives (what
    each trial had spent at the rung) by Pareto fronts (median is refused by the config).

    Example:
        >>> from trials.config import parse_config
        >>> cfg = parse_config({
        ...     "name": "demo", "entrypoint": "model:Trial",
        ...     "hyperparameters": {"global_batch_size": 64},
        ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2,
        ...                  "max_length": {"batches": 900},
        ...                  "pruner": {"name": "hyperband", "min_resource": 100}},
        ... })
        >>> pruner_spec(cfg)
        PrunerSpec(name='HyperbandPruner', kwargs={'min_resource': 100, 'max_resource': 900, 'reduction_factor': 3})
        >>> from trials.config import MaxLength
        >>> searcher = cfg.searcher.model_copy(update={
        ...     "pruner": cfg.searcher.pruner.model_copy(update={"min_resource": 0.5}),
        ...     "max_length": MaxLength(slot_seconds=60)})
        >>> pruner_spec(cfg.model_copy(update={"searcher": searcher})).kwargs
        {'min_resource': 50, 'max_resource': 6000, 'reduction_factor': 3}
        >>> from trials.config import ObjectiveConfig
        >>> costly = cfg.searcher.model_copy(
        ...     update={"objectives": [ObjectiveConfig(name="wall_seconds")]})
        >>> pruner_spec(cfg.model_copy(update={"searcher": costly})).name
        'ParetoHyperbandPruner'
    """
    pruner = config.searcher.pruner
    steps = _resource_steps(config)
    pareto = "Pareto" if config.searcher.objectives else ""
    if pruner.name == "asha":
        return PrunerSpec(
            name=f"{pareto}SuccessiveHalvingPruner",
            kwargs={
                "min_resource": steps(pruner.min_resource),
                "reduction_factor": pruner.reduction_factor,
                "min_early_stopping_rate": pruner.min_early_stopping_rate,
            },
        )
    if pruner.name == "hyperband":
        return PrunerSpec(
            name=f"{pareto}HyperbandPruner",
            kwargs={
                "min_resource": steps(pruner.min_resource),
                "max_resource": config.searcher.max_length.value,
                "reduction_factor": pruner.reduction_factor,
            },
        )
    if pruner.name == "median":
        return PrunerSpec(
            name="MedianPruner",
            kwargs={
                "n_startup_trials": pruner.n_startup_trials,
                # In slot-seconds no validation sits at step 0, so no + 1 there.
                "n_warmup_steps": (
                    steps(pruner.n_warmup_steps)
                    if config.searcher.resource_unit == "slot_seconds"
                    else pruner.n_warmup_steps + 1
                ),
            },
        )
    assert pruner.name == "none", pruner.name
    return None


def _resource_steps(config: ExperimentConfig) -> Callable[[float], int]:
    """Converts an amount of the pruner's resource to Optuna's integer steps."""
    if config.searcher.resource_unit == "slot_seconds":
        return slot_seconds_step
    return int


def build_pruner(config: ExperimentConfig) -> optuna.pruners.BasePruner:
    """The driver's pruner: :func:`pruner_spec` built (:func:`trials.pruning.build_pruner`),
    or ``NopPruner`` for none.

    Example:
        >>> from trials.config import parse_config
        >>> cfg = parse_config({
        ...     "name": "demo", "entrypoint": "model:Trial",
        ...     "hyperparameters": {"global_batch_size": 64},
        ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2,
        ...                  "max_length": {"epochs": 1}},
        ... })
        >>> type(build_pruner(cfg)).__name__
        'NopPruner'
    """
    return pruning.build_pruner(pruner_spec(config))


def study_directions(config: ExperimentConfig) -> list[Direction]:
    """Optuna directions: the searcher metric first, then each cost objective (minimized).

    Example:
        >>> from trials.config import parse_config
        >>> cfg = parse_config({
        ...     "name": "demo", "entrypoint": "model:Trial",
        ...     "hyperparameters": {"global_batch_size": 64},
        ...     "searcher": {"name": "nsga2", "metric": "val_accuracy",
        ...                  "smaller_is_better": False, "max_trials": 2,
        ...                  "max_length": {"epochs": 1}, "objectives": ["slot_seconds"]},
        ... })
        >>> study_directions(cfg)
        ['maximize', 'minimize']
    """
    return config.searcher.directions


def _session_seed(seed: int | None, trials_so_far: int) -> int | None:
    """The config's seed for a new search; a seed derived from it for a resumed one."""
    if seed is None or trials_so_far == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, trials_so_far]).generate_state(1)[0])


def _population_size(max_trials: int) -> int:
    return max(
        _NSGA2_MIN_POPULATION,
        min(_NSGA2_MAX_POPULATION, max_trials // _NSGA2_MIN_GENERATIONS),
    )


@functools.cache
def _driver_grid_sampler_class() -> type[optuna.samplers.GridSampler]:
    """``GridSampler`` that leaves stopping to the driver (built on first use: lazy Optuna)."""
    import optuna

    class DriverGridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler without ``study.stop()`` after the last grid point.

        ``study.stop()`` only works inside ``study.optimize``; under ask/tell it makes
        ``study.tell`` raise after the trial is stored. The driver bounds a grid search
        by :func:`searcher.submit.space.grid_size` instead.
        """

        def after_trial(
            self,
            study: optuna.Study,
            trial: optuna.trial.FrozenTrial,
            state: optuna.trial.TrialState,
            values: Any,
        ) -> None:
            return None

    return DriverGridSampler
