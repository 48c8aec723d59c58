"""SIGTERM as "checkpoint and stop", for trials whose cluster engine warns with it.

Slurm sends SIGTERM to every process of a job it preempts, that reaches its time
limit or that ``scancel`` ends, and SIGKILL after a grace time (``GraceTime``,
``KillWait``). With ``SLOTSWEEP_CHECKPOINT_ON_SIGTERM=1`` in its environment (the
Slurm job executor sets it) a rank does not die on SIGTERM: it notes the request,
rank 0 checkpoints at its next report and the trial stops as it does on the
driver's own stop request. Without it, SIGTERM ends the rank at once (the local
executor stops attempts that way).

While a rank joins its process group, torch waits in C++ code (the store's connect),
where Python's own SIGTERM handler cannot run: :func:`sigterm_ends_at_once` lets the
kernel end the rank instead, when SIGTERM would end it anyway. Otherwise the siblings of
a rank that could not start (its port taken) sat there until torchrun's SIGKILL, 30 s
later, before the trial could start again.

Example (outside a rank that the launcher asked to checkpoint on SIGTERM, nothing is
installed; in such a rank the call answers ``True``):

    >>> install_checkpoint_on_sigterm()
    False
    >>> stop_asked()
    False
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from trials.launch.launcher import CHECKPOINT_ON_SIGTERM_ENV_VAR

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


@contextlib.contextmanager
def sigterm_ends_at_once() -> Iterator[None]:
    """SIGTERM's default action (the end of the process) inside the ``with`` block.

    For a rank that has nothing to save or record yet (joining its group). Not where
    SIGTERM asks to checkpoint (the request is kept for the first report) or is
    ignored, and not outside the main thread (a test calling a rank's code).
    """
    previous = signal.getsignal(signal.SIGTERM)
    if (
        previous in (_on_sigterm, signal.SIG_IGN)
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
