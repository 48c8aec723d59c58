"""The UI's only writes: a confirmed request to pause or kill an experiment.

The request is the same one ``slotsweep pause|kill`` makes from a terminal: it sets
``Experiment.requested_action`` and the experiment's driver, which polls that
column, carries it out. One short transaction through the normal (writing) engine.
"""

from __future__ import annotations

from storage import Experiment, session_scope

ACTIONS = {
    "pause": "Pause: start no new trials; running trials stop at their next checkpoint.",
    "kill": "Kill: stop every running trial now and end the experiment.",
}


def request_action(url: str, experiment_id: int, action: str) -> str:
    """Ask the experiment's driver to ``pause`` or ``kill``; returns what happened, in words.

    Example:
        >>> request_action("sqlite:///slotsweep.db", 3, "pause")  # doctest: +SKIP
        'Requested pause of experiment 3; its driver acts on it at its next poll.'
    """
    if action not in ACTIONS:
        raise ValueError(f"action: must be one of {', '.join(ACTIONS)}, got {action!r}")
    with session_scope(url) as session:
        experiment = session.get(Experiment, experiment_id)
        if experiment is None:
            return f"Experiment {experiment_id} does not exist."
        if experiment.state.is_terminal:
            return (
                f"Experiment {experiment_id} is already {experiment.state.value}; nothing to do."
            )
        experiment.requested_action = action
    return f"Requested {action} of experiment {experiment_id}; its driver acts on it at its next poll."
