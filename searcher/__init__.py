"""slotsweep's searcher: experiment configs, the search space, the driver, the Python API
(:mod:`searcher.api`: ``searcher.run``, ``searcher.Experiment``) and the CLI.

Public names load on first use, so ``slotsweep --help`` and config errors do not
pay for Optuna and SQLAlchemy.

Example:
    >>> from searcher import load_config, SearchDriver
    >>> config = load_config("examples/digits/experiment.yaml")
    >>> config.name, config.searcher.max_trials
    ('digits-large-batch', 8)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from searcher.api import (
        Experiment,
        TrialRef,
        TrialSummary,
        continue_search,
        resume,
        run,
        submit,
    )
    from searcher.consistency import ConsistencyReport, check_consistency
    from searcher.driver import SearchDriver
    from searcher.experiments import UsageError, create_experiment, find_experiment
    from searcher.samplers import build_pruner, build_sampler, pruner_spec, study_directions
    from searcher.space import (
        distributions,
        grid_search_space,
        grid_size,
        parse_enqueue_params,
        suggest_hparams,
    )
    from searcher.submission import ValidatedRun, validate_run
    from trials.config import ConfigError, ExperimentConfig, load_config, parse_config

_EXPORTS = {
    "Experiment": "searcher.api",
    "TrialRef": "searcher.api",
    "TrialSummary": "searcher.api",
    "continue_search": "searcher.api",
    "resume": "searcher.api",
    "run": "searcher.api",
    "submit": "searcher.api",
    "ConsistencyReport": "searcher.consistency",
    "check_consistency": "searcher.consistency",
    "ConfigError": "trials.config",
    "ExperimentConfig": "trials.config",
    "load_config": "trials.config",
    "parse_config": "trials.config",
    "SearchDriver": "searcher.driver",
    "UsageError": "searcher.experiments",
    "create_experiment": "searcher.experiments",
    "find_experiment": "searcher.experiments",
    "build_pruner": "searcher.samplers",
    "build_sampler": "searcher.samplers",
    "pruner_spec": "searcher.samplers",
    "study_directions": "searcher.samplers",
    "distributions": "searcher.space",
    "grid_search_space": "searcher.space",
    "grid_size": "searcher.space",
    "parse_enqueue_params": "searcher.space",
    "suggest_hparams": "searcher.space",
    "ValidatedRun": "searcher.submission",
    "validate_run": "searcher.submission",
}

__all__ = [
    "ConfigError",
    "ConsistencyReport",
    "Experiment",
    "ExperimentConfig",
    "SearchDriver",
    "TrialRef",
    "TrialSummary",
    "UsageError",
    "ValidatedRun",
    "build_pruner",
    "build_sampler",
    "check_consistency",
    "continue_search",
    "create_experiment",
    "distributions",
    "find_experiment",
    "grid_search_space",
    "grid_size",
    "load_config",
    "parse_config",
    "parse_enqueue_params",
    "pruner_spec",
    "resume",
    "run",
    "study_directions",
    "submit",
    "suggest_hparams",
    "validate_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'searcher' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
