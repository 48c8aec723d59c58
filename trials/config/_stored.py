"""The typed experiment config of a stored experiment: the one reader of its JSON column.

``slotsweep run`` stores ``ExperimentConfig.model_dump(mode="json")`` in
``Experiment.config``; every later reader (the driver, ``continue``, the cluster queue,
the CLI tables and the UI) turns that JSON back into an :class:`ExperimentConfig`
here, and reads typed fields from it, so each default lives in the model alone.

A row written by an older version lacks the fields added since: the model gives them
their defaults, which is what that version did without them. No field was ever removed
or renamed, so every older row reads. A row that does not read (edited by hand, or
written by a newer version with fields this one does not know) raises
:class:`StoredConfigError` with one line saying why; readers that must not fail on one
bad row (the queue, the UI) catch it.

Example:
    >>> stored = {
    ...     "name": "demo", "entrypoint": "model:Trial",
    ...     "hyperparameters": {"global_batch_size": {"type": "const", "val": 64}},
    ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2,
    ...                  "max_length": {"epochs": 1}},
    ... }
    >>> config = read_stored_config(stored)
    >>> config.resources.priority, config.hang_timeout_s
    (42, 600.0)
    >>> read_stored_config({"name": "demo"})
    Traceback (most recent call last):
    ...
    trials.config._stored.StoredConfigError: stored experiment config: entrypoint: required field is missing
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from trials.config._experiment import (
    ExperimentConfig,
    Hyperparameter,
    ResourcesConfig,
    format_config_error,
)


class StoredConfigError(ValueError):
    """A stored experiment config that this version cannot read."""


def read_stored_config(stored: Any) -> ExperimentConfig:
    """The typed config of an experiment row's ``config`` JSON (see the module docstring).

    Raises :class:`StoredConfigError` naming the first problem when it does not read.
    """
    if not isinstance(stored, dict):
        raise StoredConfigError(
            f"stored experiment config: must be a mapping, got {type(stored).__name__}"
        )
    try:
        return ExperimentConfig.model_validate(stored)
    except ValidationError as exc:
        problems = sorted({format_config_error(error) for error in exc.errors()})
        raise StoredConfigError(f"stored experiment config: {problems[0]}") from None


def read_stored_hyperparameters(stored: Any) -> dict[str, Hyperparameter]:
    """The typed search space of a stored config, even when the rest of it does not read.

    The consistency check compares Optuna's trials with the space alone, so a config
    unreadable elsewhere still gets its space checked. Raises
    :class:`StoredConfigError` when the space itself does not read.
    """
    space = stored.get("hyperparameters") if isinstance(stored, dict) else None
    try:
        return _SPACE.validate_python(space or {})
    except ValidationError as exc:
        # Located as in the whole config, so the line names the field as users wrote it.
        error = exc.errors()[0]
        problem = format_config_error({**error, "loc": ("hyperparameters", *error["loc"])})
        raise StoredConfigError(f"stored experiment config: {problem}") from None


def read_stored_resources(stored: Any) -> ResourcesConfig:
    """The typed ``resources`` of a stored config, even when the rest of it does not read.

    Who holds what share of a slot (the consistency check) depends on this section
    alone. Raises :class:`StoredConfigError` when the section itself does not read.

    Example:
        >>> read_stored_resources({"resources": {"slots_per_trial": 0.25}}).slot_share
        0.25
        >>> read_stored_resources({}).slots_per_trial
        1
    """
    resources = stored.get("resources") if isinstance(stored, dict) else None
    try:
        return ResourcesConfig.model_validate(resources or {})
    except ValidationError as exc:
        error = exc.errors()[0]
        problem = format_config_error({**error, "loc": ("resources", *error["loc"])})
        raise StoredConfigError(f"stored experiment config: {problem}") from None


_SPACE: TypeAdapter[dict[str, Hyperparameter]] = TypeAdapter(dict[str, Hyperparameter])
