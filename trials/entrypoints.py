"""A trial's ``entrypoint`` (``module:Name``) resolved without importing torch.

The ranks resolve it to run the trial, and the driver's check before a search
(:mod:`searcher.submit._entrypoint_probe`) resolves it the same way in a process of its own.
That check imports what the user's module imports and nothing more: a trial that is a
plain function (scikit-learn, XGBoost, a simulation) is checked without paying for
torch's import.

Example:
    >>> import pathlib, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = (pathlib.Path(folder) / "entry_example.py").write_text("def main(context): pass")
    >>> load_entrypoint("entry_example:main", folder).__name__
    'main'
    >>> load_entrypoint("entry_example:mian", folder)
    Traceback (most recent call last):
    ...
    trials.entrypoints.InvalidTrialError: entrypoint: module 'entry_example' has no 'mian'
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class InvalidTrialError(ValueError):
    """A trial that cannot run as configured (bad hparams, entrypoint, metric name).

    The worker prints its message as one line and exits with code 2.
    """


def load_entrypoint(entrypoint: str, model_dir: str) -> Any:
    """The object ``entrypoint`` names, imported with ``model_dir`` first on the path.

    It must be a ``PyTorchTrial`` subclass or a callable taking the trial context: a
    class is callable, so what is checked here is only that it can be called.
    """
    module_name, _, attr = entrypoint.partition(":")
    if not module_name or not attr:
        raise InvalidTrialError(
            f"entrypoint: must be 'module:Name', e.g. 'model:DigitsTrial', got {entrypoint!r}"
        )
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name.split(".")[0] and error.name != module_name:
            raise  # the user's module exists but imports something missing: show the traceback
        raise InvalidTrialError(
            f"entrypoint: no module {module_name!r} in the model directory {model_dir}"
        ) from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise InvalidTrialError(f"entrypoint: module {module_name!r} has no {attr!r}") from None
    if not callable(target):
        raise InvalidTrialError(
            f"entrypoint: {entrypoint} must be a PyTorchTrial subclass or a callable "
            "taking the trial context"
        )
    return target
