"""How the learning-curve chart reads an experiment's config: its step axis and ASHA's rungs.

The runtime reports the searcher metric to Optuna at steps in ``searcher.max_length``'s
unit (epochs or batches; see ``searcher.samplers.pruner_spec``), so the chart uses that
unit and ASHA's rungs fall on it: rung ``k`` is at ``min_resource x
reduction_factor ** (min_early_stopping_rate + k)``, below ``max_length``.

Example:
    >>> config = {"searcher": {"max_length": {"epochs": 30}, "pruner": {
    ...     "name": "asha", "min_resource": 1, "reduction_factor": 3}}}
    >>> curve_axis(config), asha_rungs(config)
    ('epoch', [1.0, 3.0, 9.0, 27.0])
"""

from __future__ import annotations

from typing import Any


def _max_length(config: dict[str, Any]) -> tuple[str, float | None]:
    length = config.get("searcher", {}).get("max_length") or {}
    if length.get("epochs") is not None:
        return "epoch", float(length["epochs"])
    if length.get("batches") is not None:
        return "step", float(length["batches"])
    return "step", None


def curve_axis(config: dict[str, Any]) -> str:
    """``'epoch'`` or ``'step'`` (batches): the field the curves are drawn against."""
    return _max_length(config)[0]


def asha_rungs(config: dict[str, Any]) -> list[float]:
    """The rungs of an ASHA pruner in the curve axis' unit; empty for any other pruner."""
    pruner = config.get("searcher", {}).get("pruner") or {}
    if pruner.get("name") != "asha":
        return []
    _, limit = _max_length(config)
    resource = float(pruner.get("min_resource", 1))
    factor = float(pruner.get("reduction_factor", 3))
    rung = resource * factor ** int(pruner.get("min_early_stopping_rate", 0) or 0)
    rungs: list[float] = []
    # A rung at max_length itself decides nothing: training ends there anyway.
    while (limit is None or rung < limit) and len(rungs) < 32 and factor > 1:
        rungs.append(rung)
        rung *= factor
    return rungs
