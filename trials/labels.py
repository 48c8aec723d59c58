"""The one user-facing name of a trial: its Optuna trial number within its experiment.

Database ids are an implementation detail (they interleave across experiments and
differ from what Optuna, optuna-dashboard and the samplers call a trial), so every
output shows the experiment's trial number: ``3.1`` (experiment 3, trial number 1)
where several experiments may appear, ``#1`` where the experiment is already clear.

Example:
    >>> trial_label(3, 1), trial_label(None, 1)
    ('3.1', '#1')
    >>> trial_log_name(1)
    'trial-1.log'
"""

from __future__ import annotations


def trial_label(experiment_id: int | None, number: int) -> str:
    """``EXPERIMENT.NUMBER`` when ``experiment_id`` is given, else ``#NUMBER``."""
    if experiment_id is None:
        return f"#{number}"
    return f"{experiment_id}.{number}"


def trial_log_name(number: int) -> str:
    """The file name of a trial's log inside its experiment's log folder."""
    return f"trial-{number}.log"
