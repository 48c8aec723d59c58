"""A node process's end without the interpreter's teardown, once its work is done.

A process that imported torch spends about 0.1-0.7 s of CPU at exit tearing its modules
down (the last garbage collection walks every object torch, and ``torch._dynamo`` where
imported, made), after its work is over: on every rank and every ``torchrun`` wrapper
of every trial, and the driver only sees the trial's processes gone once it is done.
Here the exit runs the atexit handlers and flushes the standard streams, then ends the
process at once. Only once what the process wrote is committed: its connections are
not closed, so an SQLite file's write-ahead log is checkpointed by the processes that
still have it open (the driver), not by this one; the commits are durable either way.

Example (a process's last line)::

    exit_without_teardown(main())
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Exit with ``code`` after the atexit handlers, skipping the interpreter's teardown.

    A rank calls it once the process group is left and the records are committed, a
    ``torchrun`` wrapper once its ranks are gone. Besides its cost, a rank's teardown can
    abort a finished rank: gloo's worker threads outlive ``destroy_process_group`` and
    finalization sometimes ends them with ``terminate called without an active
    exception`` (SIGABRT), which torchrun reports as a failed job. User code's atexit
    handlers still run; only module teardown is skipped.
    """
    run_exit_handlers()
    os._exit(code)


def run_exit_handlers() -> None:
    """The atexit handlers, then the streams flushed: a process's end short of teardown."""
    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
