"""Optional packages behind an integration: imported on use, named with their pip command.

TensorBoard and MLflow are extras (``slotsweep[tensorboard]``, ``slotsweep[mlflow]``), not
dependencies: a search that uses neither never imports them. A command or a config
that needs one which is missing fails in one line that says what to install.

Example:
    >>> require("json", extra="none").__name__
    'json'
    >>> require("no_such_module_here", extra="tensorboard")
    Traceback (most recent call last):
    ...
    searcher.experiments.UsageError: no_such_module_here is not installed: pip install 'slotsweep[tensorboard]'
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from searcher.experiments import UsageError
from trials.config import ExperimentConfig


def missing_extra_message(module: str, extra: str) -> str:
    """The one line saying ``module`` is missing and the command that installs it."""
    return f"{module} is not installed: pip install 'slotsweep[{extra}]'"


def ensure_installed(module: str, *, extra: str) -> None:
    """:func:`require` without the import (MLflow takes seconds to import: the thread does).

    Example:
        >>> ensure_installed("json", extra="none")
    """
    if importlib.util.find_spec(module) is None:
        raise UsageError(missing_extra_message(module, extra))


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module``; a :class:`UsageError` naming ``pip install 'slotsweep[extra]'`` if absent."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(missing_extra_message(module.partition(".")[0], extra)) from None


def integration_problem(config: ExperimentConfig) -> str | None:
    """Why ``config``'s integrations cannot run here (an extra is missing), or None.

    Checked when a run is submitted, so a missing extra stops it before anything is
    written rather than in the driver.

    Example:
        >>> integration_problem(config) is None
        True
    """
    if config.integrations.mlflow is not None:
        try:
            ensure_installed("mlflow", extra="mlflow")
        except UsageError as exc:
            return f"integrations.mlflow: {exc}"
    return None
