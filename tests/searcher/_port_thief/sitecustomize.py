"""Takes the port a trial's first attempt is given, as another process on a busy machine would.

A test puts this folder on the ``PYTHONPATH`` of a search's driver; its trials inherit
the environment, so this runs at the start of every Python process of every attempt.
``SLOTSWEEP_TEST_TAKE_PORT`` is ``MODE:MARKER``. The first process that fits ``MODE``
creates the file ``MARKER`` (exclusively: later attempts find it and leave their ports
alone), binds the port and listens on it for as long as it lives, and writes the port
into ``MARKER``. Every process that fits ``MODE`` appends its port to ``MARKER.seen``,
one line per attempt, so a test can check that the next attempt got another port.

- ``master``: rank 0 takes ``MASTER_PORT``, which torchrun picked free a moment ago and
  which rank 0's ``init_process_group`` is about to bind for the ranks' store;
- ``rdzv``: the ``torchrun`` that hosts the c10d rendezvous store (``is_host=1``) takes
  the ``--rdzv-endpoint`` port it is about to bind.

Nothing happens without the variable. A rank forked from its ``torchrun``
(:mod:`trials.node.torchrun`) starts no interpreter of its own: there the port is taken
when torchrun runs the rank's script (``runpy.run_path``, in the child), by then
given its ``RANK`` and ``MASTER_PORT``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

_ENV_VAR = "SLOTSWEEP_TEST_TAKE_PORT"
# Open for the whole life of the process that took the port.
_held: list[socket.socket] = []


def _port_to_take(mode: str) -> int | None:
    if mode == "master":
        if os.environ.get("RANK") == "0" and os.environ.get("MASTER_PORT"):
            return int(os.environ["MASTER_PORT"])
        return None
    if mode == "rdzv" and os.environ.get("PET_RDZV_CONF") == "is_host=1":
        with open("/proc/self/cmdline", "rb") as cmdline:
            args = cmdline.read().decode().split("\0")
        if "trials.node.torchrun" not in args:
            return None  # a rank: it inherited torchrun's environment
        for arg in args:
            if arg.startswith("--rdzv-endpoint="):
                return int(arg.rpartition(":")[2])
    return None


def _take() -> None:
    mode, _, marker = os.environ.get(_ENV_VAR, "").partition(":")
    port = _port_to_take(mode) if marker else None
    if port is None:
        return
    with open(f"{marker}.seen", "a") as seen:
        seen.write(f"{port}\n")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # taken once, by an earlier attempt
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", port))
    sock.listen()
    _held.append(sock)
    os.write(fd, str(port).encode())
    os.close(fd)


def _take_in_forked_ranks() -> None:
    import runpy

    run_path = runpy.run_path

    def take_then_run(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(_ENV_VAR, "").startswith("master:"):
            with contextlib.suppress(Exception):
                _take()
        return run_path(*args, **kwargs)

    runpy.run_path = take_then_run


with contextlib.suppress(Exception):
    _take()
    _take_in_forked_ranks()
