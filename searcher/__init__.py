"""slotsweep's searcher: a search from its config to its end, and every way to steer it.

Its rooms, each building on those before it: the package's own modules
(:mod:`searcher.experiments`: an experiment found by id or name; :mod:`searcher.logs`:
its log folders), :mod:`searcher.integrations` (TensorBoard, MLflow, webhooks),
:mod:`searcher.submit` (config to a validated, created experiment),
:mod:`searcher.driver` (the search driver), then :mod:`searcher.diagnose` (``run --test``,
``diagnose``, the consistency check) and :mod:`searcher.api` (the Python API:
``searcher.run``, ``searcher.Experiment``), and at the top :mod:`searcher.cli` (the
``slotsweep`` command). ``tests/test_dependencies.py`` checks that order.

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
    from searcher.diagnose.consistency import ConsistencyReport, check_consistency
    from searcher.driver.driver import SearchDriver
    from searcher.experiments import UsageError, find_experiment
    from searcher.submit.creation import create_experiment
    from searcher.submit.samplers import build_pruner, build_sampler, pruner_spec, study_directions
    from searcher.submit.space import (
        distributions,
        grid_search_space,
        grid_size,
        parse_enqueue_params,
        suggest_hparams,
    )
    from searcher.submit.submission import ValidatedRun, validate_run
    from trials.config import ConfigError, ExperimentConfig, load_config, parse_config

_EXPORTS = {
    "Experiment": "searcher.api",
    "TrialRef": "searcher.api",
    "TrialSummary": "searcher.api",
    "continue_search": "searcher.api",
    "resume": "searcher.api",
    "run": "searcher.api",
    "submit": "searcher.api",
    "ConsistencyReport": "searcher.diagnose.consistency",
    "check_consistency": "searcher.diagnose.consistency",
    "ConfigError": "trials.config",
    "ExperimentConfig": "trials.config",
    "load_config": "trials.config",
    "parse_config": "trials.config",
    "SearchDriver": "searcher.driver.driver",
    "UsageError": "searcher.experiments",
    "create_experiment": "searcher.submit.creation",
    "find_experiment": "searcher.experiments",
    "build_pruner": "searcher.submit.samplers",
    "build_sampler": "searcher.submit.samplers",
    "pruner_spec": "searcher.submit.samplers",
    "study_directions": "searcher.submit.samplers",
    "distributions": "searcher.submit.space",
    "grid_search_space": "searcher.submit.space",
    "grid_size": "searcher.submit.space",
    "parse_enqueue_params": "searcher.submit.space",
    "suggest_hparams": "searcher.submit.space",
    "ValidatedRun": "searcher.submit.submission",
    "validate_run": "searcher.submit.submission",
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
