"""Checks made before a search spends any slot: does the experiment's code even load?

:func:`check_entrypoint` resolves the config's ``entrypoint`` the way every rank will,
but once, in a short subprocess (``python -m searcher.submit._entrypoint_probe``) with the
model directory as its working directory and first on ``sys.path``: the user's module
runs its import-time code there, so nothing it does can hurt the driver, and a typo
costs a second or two instead of every trial's restarts.

With the entrypoint misspelt as ``model:DigitTrial`` in the digits example's config,
the probe answers as below (the probe, a Python process importing torch, takes
seconds: tests/searcher/submit/test_preflight.py runs it, not the docstring examples)::

    check_entrypoint(config, Path("examples/digits"))
    # ["entrypoint: module 'model' has no 'DigitTrial' (did you mean 'DigitsTrial'?)"]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from searcher.submit._entrypoint_probe import MARKER

if TYPE_CHECKING:
    from trials.config import ExperimentConfig

# Importing torch costs 1-2 s; a module that takes minutes to import is a problem too.
TIMEOUT_S = 120.0
_PACKAGES_ROOT = Path(__file__).resolve().parent.parent


def check_entrypoint(
    config: ExperimentConfig, model_dir: Path, *, timeout_s: float = TIMEOUT_S
) -> list[str]:
    """Problems with ``config.entrypoint`` in ``model_dir``, one line each; ``[]`` if it loads.

    Resolves ``module:Name``: the module must import, have ``Name``, and ``Name`` must
    be a ``PyTorchTrial`` subclass or a callable taking the trial context.
    """
    model_dir = Path(model_dir).resolve()
    env = dict(os.environ)
    # The user's import-time code has no business with the database's credentials.
    for name in ("SLOTSWEEP_DB", "SLOTSWEEP_DB_URL"):
        env.pop(name, None)
    # slotsweep's own packages stay importable from the model directory (a source
    # checkout that is not installed); the model directory still comes first.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH"), str(_PACKAGES_ROOT)) if p
    )
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "searcher.submit._entrypoint_probe",
                str(model_dir),
                config.entrypoint,
            ],
            cwd=model_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [
            f"entrypoint: importing {config.entrypoint.partition(':')[0]!r} took longer than "
            f"{timeout_s:g} s"
        ]
    except OSError as error:
        return [f"entrypoint: could not start a Python process to check it: {error.strerror}"]
    verdicts = [line for line in result.stdout.splitlines() if line.startswith(MARKER)]
    if not verdicts:
        # The import killed the interpreter (os._exit, a crash in a C extension).
        last = next((line for line in reversed(result.stderr.splitlines()) if line.strip()), "")
        detail = f": {last.strip()}" if last else ""
        return [
            f"entrypoint: importing {config.entrypoint.partition(':')[0]!r} ended the process "
            f"(exit code {result.returncode}){detail}"
        ]
    problem = json.loads(verdicts[-1][len(MARKER) :])
    return [] if problem is None else [str(problem)]
