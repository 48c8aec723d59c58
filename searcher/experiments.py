"""Finding and controlling recorded experiments: what every part of searcher shares.

An experiment is named on the command line, in the API and in the UI by its id or its
name (:func:`find_experiment`); a mistake there is a :class:`UsageError`, which the CLI
prints as one line with exit code 2. What is read of an experiment once found (its
trials, their counts, the best ones) is the read model's, :mod:`trials.queries`."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import Experiment, session_scope
from trials.coordination import control

__all__ = ["UsageError", "find_experiment", "request_action"]


class UsageError(Exception):
    """A user mistake the CLI reports as one line with exit code 2."""


def find_experiment(session: Session, ref: str) -> Experiment:
    """An experiment by id, or by a name that exactly one experiment has.

    Names may repeat (every run of a config takes its name), so a name several
    experiments share is refused with their ids rather than silently picking one.
    """
    if ref.isdigit():
        experiment = session.get(Experiment, int(ref))
    else:
        matches = list(
            session.scalars(
                select(Experiment).where(Experiment.name == ref).order_by(Experiment.id)
            )
        )
        if len(matches) > 1:
            ids = ", ".join(str(m.id) for m in matches)
            raise UsageError(
                f"experiment: {len(matches)} experiments are named '{ref}' (ids {ids}); "
                "give one of the ids"
            )
        experiment = matches[0] if matches else None
    if experiment is None:
        raise UsageError(f"experiment: no experiment with id or name '{ref}'")
    return experiment


def request_action(db_url: str, ref: str, action: control.Action) -> str:
    """``pause``, ``activate`` or ``kill`` the experiment ``ref`` (id or name), from any terminal.

    Resolves ``ref`` as every command does, then takes the one path the UI also takes
    (:func:`trials.coordination.control.request_action`); returns what happened, in words.
    """
    with session_scope(db_url) as session:
        experiment_id = find_experiment(session, ref).id
    try:
        return control.request_action(db_url, experiment_id, action)
    except control.ActionRefused as exc:
        raise UsageError(f"experiment: {exc}") from None
