"""Moving an experiment's folders: ``resume`` and ``continue`` with ``--relocate OLD=NEW``.

An experiment stores its folders as absolute paths: the model folder (the trials' working
directory, where the entrypoint is imported), the config file, the checkpoint folder and
every checkpoint, and each trial's log. A database copied to another folder or machine
still names the original's: a run from the copy would write there. ``--relocate
OLD=NEW`` (as rsync or a container's volume would map it) reads every stored path under
``OLD`` as the same path under ``NEW``; given several times, the longest ``OLD`` that
matches wins. When the run starts, the experiment's rows are rewritten, so later
commands and the UI see the new paths and need no option.

Without a relocation, a stored folder the run would write into that no longer exists is
refused (:func:`missing_folder`): the model folder, the checkpoint folder once a
checkpoint was recorded, and the log folders of trials that run again.

Example:
    >>> moves = Relocation.parse(["/home/ana/search=/data/search"])
    >>> moves.apply("/home/ana/search/checkpoints/3f2a")
    '/data/search/checkpoints/3f2a'
    >>> moves.apply("/home/ana/searches/other")
    '/home/ana/searches/other'
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.experiments import UsageError
from storage import Checkpoint, Experiment, Trial, TrialState, session_scope
from trials import checkpoint_root
from trials.config import ExperimentConfig, read_stored_config

__all__ = ["NO_RELOCATION", "Relocation", "missing_folder", "relocate_experiment"]

OPTION = "--relocate"


@dataclass(frozen=True)
class Relocation:
    """Stored path prefixes and where they are now, longest prefix first."""

    moves: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Relocation:
        """``OLD=NEW`` pairs as the user typed them; ``NEW`` may be relative (to here).

        Example:
            >>> Relocation.parse(["data=/x"])
            Traceback (most recent call last):
            ...
            searcher.experiments.UsageError: --relocate: OLD must be an absolute path as the database stores it, got 'data'
        """
        moves: list[tuple[str, str]] = []
        for text in texts:
            old, sep, new = text.partition("=")
            if not sep or not old or not new:
                raise UsageError(f"{OPTION}: expected OLD=NEW (two folders), got {text!r}")
            if not os.path.isabs(old):
                raise UsageError(
                    f"{OPTION}: OLD must be an absolute path as the database stores it, "
                    f"got {old!r}"
                )
            moves.append((os.path.normpath(old), os.path.abspath(new)))
        moves.sort(key=lambda move: len(move[0]), reverse=True)
        return cls(tuple(moves))

    def __bool__(self) -> bool:
        return bool(self.moves)

    def apply(self, path: str) -> str:
        """``path`` with the longest matching ``OLD`` prefix replaced by its ``NEW``."""
        for old, new in self.moves:
            if path == old:
                return new
            if path.startswith(old.rstrip(os.sep) + os.sep):
                return new + path[len(old.rstrip(os.sep)) :]
        return path

    def config(self, config: ExperimentConfig) -> ExperimentConfig:
        """``config`` with an absolute checkpoint path relocated (a relative one follows the model folder)."""
        storage = config.checkpoint_storage
        moved = self.apply(storage.path) if os.path.isabs(storage.path) else storage.path
        if moved == storage.path:
            return config
        return config.model_copy(
            update={"checkpoint_storage": storage.model_copy(update={"path": moved})}
        )


#: Stored paths read as they are.
NO_RELOCATION = Relocation()


def missing_folder(session: Session, experiment: Experiment, relocation: Relocation) -> str | None:
    """The one-line refusal for a stored folder the run would use that does not exist, or None.

    Paths are read through ``relocation`` first, so a relocated folder must exist too.
    """
    model_dir = Path(relocation.apply(experiment.model_dir))
    config = relocation.config(read_stored_config(experiment.config))
    folders = [("model folder", model_dir)]
    recorded = session.scalar(
        select(Checkpoint.id)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id == experiment.id)
        .limit(1)
    )
    root = checkpoint_root(config, model_dir)
    # A bucket (checkpoint_storage.path a URL) is no folder here: it is not relocated,
    # and one that is missing fails the first write with one line.
    if recorded is not None and isinstance(root, Path):
        folders.append(("checkpoint folder", root))
    for log_path in session.scalars(
        select(Trial.log_path).where(
            Trial.experiment_id == experiment.id,
            Trial.state.in_([TrialState.QUEUED, TrialState.RUNNING]),
            Trial.log_path.is_not(None),
        )
    ):
        assert log_path is not None
        folders.append(("trial log folder", Path(relocation.apply(log_path)).parent))
    for what, folder in folders:
        if folder.is_dir():
            continue
        if relocation:
            return f"{OPTION}: experiment {experiment.id}'s {what} would be {folder}, which does not exist"
        return (
            f"experiment: {experiment.id}'s {what} {folder} does not exist (was the database "
            f"copied or moved?); give {OPTION} OLD=NEW, OLD a stored folder above it and NEW "
            "where that folder is now"
        )
    return None


def relocate_experiment(db_url: str, experiment_id: int, relocation: Relocation) -> None:
    """Rewrite every path the experiment stores through ``relocation``, in one transaction."""
    if not relocation:
        return
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        _relocate(session, experiment, relocation)


def _relocate(session: Session, experiment: Experiment, relocation: Relocation) -> None:
    experiment.model_dir = relocation.apply(experiment.model_dir)
    if experiment.config_path:
        experiment.config_path = relocation.apply(experiment.config_path)
    config = read_stored_config(experiment.config)
    moved = relocation.config(config)
    if moved is not config:
        # A new dict (not an in-place change) so SQLAlchemy sees the JSON column change.
        experiment.config = moved.model_dump(mode="json")
    trials = select(Trial.id).where(Trial.experiment_id == experiment.id)
    for trial in session.scalars(select(Trial).where(Trial.experiment_id == experiment.id)):
        if trial.log_path:
            trial.log_path = relocation.apply(trial.log_path)
    for checkpoint in session.scalars(select(Checkpoint).where(Checkpoint.trial_id.in_(trials))):
        checkpoint.path = relocation.apply(checkpoint.path)
