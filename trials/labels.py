"""The one user-facing name of a trial: its Optuna trial number within its experiment.

Database ids are an implementation detail (they interleave across experiments and
differ from what Optuna, optuna-dashboard and the samplers call a trial), so every
output shows the experiment's trial number: ``3.1`` (experiment 3, trial number 1)
where several experiments may appear, ``#1`` where the experiment is already clear.

Example:
    >>> trial_label(3, 1), trial_label(None, 1)
    ('3.1', '#1')
    >>> parse_trial_label("3.1"), parse_trial_label("#1")
    ((3, 1), (None, 1))
    >>> trial_log_name(1)
    'trial-1.log'
    >>> checkpoint_label("/ckpt/3-5f0c/7/635301b5-9c2e-4f1e", 9)
    'the checkpoint of step 9 (635301b5)'
"""

from __future__ import annotations


def trial_label(experiment_id: int | None, number: int) -> str:
    """``EXPERIMENT.NUMBER`` when ``experiment_id`` is given, else ``#NUMBER``."""
    if experiment_id is None:
        return f"#{number}"
    return f"{experiment_id}.{number}"


def parse_trial_label(text: str) -> tuple[int | None, int] | None:
    """The ``(experiment id, trial number)`` a label names: ``'3.1'`` -> ``(3, 1)``,
    ``'#1'`` -> ``(None, 1)`` (the experiment is the reader's); None for any other text.

    The inverse of :func:`trial_label`, for every place that reads a trial's name.

    Example:
        >>> parse_trial_label(" 2.13 "), parse_trial_label("3"), parse_trial_label("#x")
        ((2, 13), None, None)
    """
    raw = text.strip()
    if raw.startswith("#"):
        number = raw[1:]
        return (None, int(number)) if number.isdecimal() else None
    experiment, dot, number = raw.partition(".")
    if dot and experiment.isdecimal() and number.isdecimal():
        return int(experiment), int(number)
    return None


def trial_log_name(number: int) -> str:
    """The file name of a trial's log inside its experiment's log folder."""
    return f"trial-{number}.log"


def checkpoint_label(location: str, step: int | None) -> str:
    """How logs, reasons and pages name a checkpoint: its step and its uuid's first 8
    characters (the last part of ``location``, a folder, a URL or the uuid itself);
    ``checkpoint <uuid>`` where its step is not known."""
    short = location.rstrip("/").rsplit("/", 1)[-1][:8]
    return f"checkpoint {short}" if step is None else f"the checkpoint of step {step} ({short})"
