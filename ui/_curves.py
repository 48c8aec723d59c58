"""How the learning-curve chart reads an experiment's config: its step axis and ASHA's
rungs; and each curve's hyperparameters, in one line for its tooltip.

The runtime reports the searcher metric to Optuna at steps in ``searcher.max_length``'s
unit (epochs or batches; see ``searcher.submit.samplers.pruner_spec``), so the chart uses that
unit and ASHA's rungs fall on it: rung ``k`` is at ``min_resource x
reduction_factor ** (min_early_stopping_rate + k)``, below ``max_length``.

Example:
    >>> from trials.config import SearcherConfig
    >>> searcher = SearcherConfig.model_validate({
    ...     "metric": "loss", "max_trials": 4, "max_length": {"epochs": 30},
    ...     "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 3}})
    >>> curve_axis(searcher), asha_rungs(searcher)
    ('epoch', [1.0, 3.0, 9.0, 27.0])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from trials.config import SearcherConfig
from ui import _format

if TYPE_CHECKING:
    import pandas as pd

    from trials.queries import LearningCurves


def curve_axis(searcher: SearcherConfig | None) -> str:
    """``'epoch'`` or ``'step'`` (batches): the field the curves are drawn against.

    ``searcher`` is None when the experiment's stored config does not read: batches are
    always recorded.
    """
    if searcher is not None and searcher.max_length.unit == "epochs":
        return "epoch"
    return "step"


def asha_rungs(searcher: SearcherConfig | None) -> list[float]:
    """The rungs of an ASHA pruner in the curve axis' unit; empty for any other pruner.

    Rungs in slot-seconds (``pruner.resource: slot_seconds``) fall at a different epoch
    for every trial, so no line on the shared axis shows them: empty too.

    Example:
        >>> from trials.config import SearcherConfig
        >>> asha_rungs(SearcherConfig.model_validate({
        ...     "metric": "loss", "max_trials": 4, "max_length": {"epochs": 30},
        ...     "pruner": {"name": "asha", "resource": "slot_seconds", "min_resource": 0.5}}))
        []
    """
    if searcher is None or searcher.pruner.name != "asha":
        return []
    if searcher.resource_unit == "slot_seconds":
        return []
    pruner = searcher.pruner
    limit = float(searcher.max_length.value)
    # The config bounds reduction_factor >= 2 and max_length, so the rungs are few.
    factor = float(pruner.reduction_factor)
    rung = float(pruner.min_resource) * factor**pruner.min_early_stopping_rate
    rungs: list[float] = []
    # A rung at max_length itself decides nothing: training ends there anyway.
    while rung < limit:
        rungs.append(rung)
        rung *= factor
    return rungs


def hparams_text(hparams: Mapping[str, Any] | None, constant: Collection[str] = ()) -> str:
    """A trial's hyperparameters in one line for a tooltip, 4 significant digits each.

    Example:
        >>> hparams_text({"lr": 0.000133333, "opt": "sgd", "hidden": 64}, {"hidden"})
        'lr=0.0001333, opt=sgd'
    """
    return ", ".join(
        f"{name}={_format.number(value)}"
        for name, value in sorted((hparams or {}).items())
        if name not in constant
    )


def with_hparams_text(curves: LearningCurves, constant: Collection[str] = ()) -> pd.DataFrame:
    """The curves' points with each trial's hyperparameters as text (``hparams``, without
    the ``constant`` ones): what the chart's tooltip shows."""
    texts = {
        number: hparams_text(hparams, constant)
        for number, hparams in curves.hyperparameters.items()
    }
    return curves.points.assign(hparams=curves.points["number"].map(texts))
