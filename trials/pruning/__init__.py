"""Pruning in multi-objective searches: MO-ASHA and Hyperband as Optuna pruners.

Owns the pruners a search's trials are asked through when the study has several
objectives (:class:`ParetoSuccessiveHalvingPruner`, :class:`ParetoHyperbandPruner`,
with :func:`report_objectives` and :func:`should_prune` in place of Optuna's
single-objective ``Trial.report`` and ``Trial.should_prune``), the one builder of any
pruner from its :class:`trials.config.PrunerSpec` (:func:`build_pruner`: the driver's
and every trial's rank 0), and the pure ranking they share with the UI and the
benchmarks: Pareto fronts, crowding distance, a rung's promotion rule, a 2-D
hypervolume, the rung decisions stored in a study, and a search's front so far with
where its pruned trials stopped (:func:`trials.queries.pareto_summary`: ``describe`` and the
UI).

May import ``storage`` (its study gateway), ``trials.config`` and the modules at
``trials``' top level; :mod:`trials.runtime` imports it (rank 0 asks the pruner). Optuna is loaded on first use of a name that needs
it, so the UI's and ``describe``'s reads of fronts and decisions do not import it.

Example:
    >>> from trials.pruning import pareto_front
    >>> pareto_front([(0.9, 50.0), (0.8, 20.0), (0.7, 30.0)], ["maximize", "minimize"])
    [0, 1]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trials.pruning._fronts import (
    Direction,
    crowding_distances,
    dominates,
    hypervolume_2d,
    non_dominated_fronts,
    pareto_front,
    promoted,
    rank_keys,
    ranked_ahead,
)
from trials.pruning._records import (
    REPORT_KEY,
    RUNG_KEY_PREFIX,
    Report,
    RungDecision,
    how_far,
    read_report,
    rung_decisions,
    rung_key,
    stopped_at,
)

if TYPE_CHECKING:
    from trials.pruning._pareto_asha import (
        PARETO_PRUNERS,
        ParetoHyperbandPruner,
        ParetoSuccessiveHalvingPruner,
        build_pruner,
        report_objectives,
        should_prune,
    )

# Loaded on first use: they import Optuna.
_LAZY = dict.fromkeys(
    (
        "PARETO_PRUNERS",
        "ParetoHyperbandPruner",
        "ParetoSuccessiveHalvingPruner",
        "build_pruner",
        "report_objectives",
        "should_prune",
    ),
    "trials.pruning._pareto_asha",
)

__all__ = [
    "PARETO_PRUNERS",
    "REPORT_KEY",
    "RUNG_KEY_PREFIX",
    "Direction",
    "ParetoHyperbandPruner",
    "ParetoSuccessiveHalvingPruner",
    "Report",
    "RungDecision",
    "build_pruner",
    "crowding_distances",
    "dominates",
    "how_far",
    "hypervolume_2d",
    "non_dominated_fronts",
    "pareto_front",
    "promoted",
    "rank_keys",
    "ranked_ahead",
    "read_report",
    "report_objectives",
    "rung_decisions",
    "rung_key",
    "should_prune",
    "stopped_at",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trials.pruning' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
