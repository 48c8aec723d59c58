"""SIGTERM as "checkpoint and stop", for trials whose cluster engine warns with it.

Slurm sends SIGTERM to every process of a job it preempts, that reaches its time
limit or that ``scancel`` ends, and SIGKILL after a grace time (``GraceTime``,
``KillWait``). With ``SLOTSWEEP_CHECKPOINT_ON_SIGTERM=1`` in its environment (the
Slurm job executor sets it) a rank does not die on SIGTERM: it notes the request,
rank 0 checkpoints at its next report and the trial stops as it does on the
driver's own stop request. Without it, SIGTERM ends the rank at once (the local
executor stops attempts that way).

Example:
    >>> install_checkpoint_on_sigterm()  # doctest: +SKIP
    True
    >>> stop_asked()
    False
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from trials.launcher import CHECKPOINT_ON_SIGTERM_ENV_VAR

_asked = threading.Event()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _asked.set()


def install_checkpoint_on_sigterm() -> bool:
    """Take SIGTERM as a stop request when the environment asks for it; whether it did."""
    if os.environ.get(CHECKPOINT_ON_SIGTERM_ENV_VAR) != "1":
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def stop_asked() -> bool:
    """Whether a SIGTERM asked this rank to checkpoint and stop."""
    return _asked.is_set()
