"""A multi-objective search's pruned trials, as the Experiment page shows them: where each
stopped (its rung, how far it had come) and what it had there, in the study's objectives.

Pure: the decisions come from :func:`trials.queries.pruned_stops`.

Example:
    >>> from trials.pruning import RungDecision
    >>> stop = RungDecision(4, 1, 3, (0.91, 0.45), promoted=False)
    >>> stops_frame([stop], ["val_accuracy", "slot_seconds"], "epochs", 2).to_dict("records")
    [{'trial': '2.4', 'rung': 1, 'stopped at': 'epoch 3', 'val_accuracy': 0.91, 'slot_seconds': 0.45}]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from trials.labels import trial_label
from trials.pruning import RungDecision, how_far


def stops_frame(
    stops: Sequence[RungDecision], objectives: Sequence[str], unit: str, experiment_id: int
) -> pd.DataFrame:
    """One row per pruned trial: its label, rung, how far it came and its values there."""
    return pd.DataFrame(
        [
            {
                "trial": trial_label(experiment_id, stop.trial_number),
                "rung": stop.rung,
                "stopped at": how_far(stop.step, unit),
                **dict(zip(objectives, stop.values, strict=True)),
            }
            for stop in stops
        ],
        columns=["trial", "rung", "stopped at", *objectives],
    )
