"""Prefix every line a process writes to its stdout and stderr, C-level output included.

Used by every process whose output lands in a trial's log: each rank prefixes its lines
with ``[rank N] `` (:mod:`trials.node.worker`) and the ``torchrun`` wrapper its own with
``[torchrun] `` (:mod:`trials.node.torchrun`), so every line of the log says who wrote it.

File descriptors 1 and 2 are routed through a small child process that reads the pipes
and writes prefixed lines to the original targets. It is a process, not a thread, so
whatever was written before a SIGKILL still reaches the log (the kernel closes the pipe,
the prefixer drains it and exits); and it exits on its own once every writer is gone.

This module imports nothing beyond the standard library: it runs before torch loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

_CHUNK = 65536

# A line holding this marker, then a file's path, tells the prefixer to write that pipe's
# later lines to that file (:func:`retarget_output`); the marker's line is not written.
_RETARGET = b"\x00slotsweep-retarget\x00"

# The log a trial's ranks must write to, as a path that reopens it (``/proc/PID/fd/N``
# of a descriptor the torchrun wrapper keeps open): torchrun's own output goes through
# the wrapper's prefixer, and a rank writing into that pipe would be prefixed twice.
LOG_TARGET_ENV_VAR = "SLOTSWEEP_LOG_TARGET"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the log is gone; nothing sensible is left to do with the line
        view = view[written:]


def _open_log(path: str | bytes) -> int:
    """A trial log opened for appending (created if new): one line per write stays whole."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _reopen(path: bytes, current: int, original: int) -> int:
    """The fd a pipe's lines go to once retargeted to ``path`` (``current`` if it won't open)."""
    try:
        fd = _open_log(path)
    except OSError:
        return current
    if current != original:
        os.close(current)
    return fd


def _pump(sources: dict[int, int], prefix: bytes) -> None:
    """Copy each source pipe to its target fd, one prefixed line per ``os.write``.

    A line carrying :data:`_RETARGET` moves that pipe's target to the file it names.
    """
    import select

    targets = dict(sources)
    pending = {fd: b"" for fd in sources}
    while pending:
        try:
            readable, _, _ = select.select(list(pending), [], [])
        except InterruptedError:
            continue
        for fd in readable:
            try:
                chunk = os.read(fd, _CHUNK)
            except InterruptedError:
                continue
            if not chunk:
                if pending[fd]:
                    _write_all(targets[fd], prefix + pending[fd] + b"\n")
                del pending[fd]
                os.close(fd)
                continue
            *lines, rest = (pending[fd] + chunk).split(b"\n")
            pending[fd] = rest
            out: list[bytes] = []
            for line in lines:
                if _RETARGET not in line:
                    out.append(prefix + line + b"\n")
                    continue
                # What the line held before the marker was written before the switch.
                before, _, path = line.partition(_RETARGET)
                if before:
                    out.append(prefix + before + b"\n")
                _write_all(targets[fd], b"".join(out))
                out = []
                targets[fd] = _reopen(path, targets[fd], sources[fd])
            if out:
                _write_all(targets[fd], b"".join(out))


def prefix_output(prefix: str) -> tuple[int, int, int]:
    """Route fds 1 and 2 through a prefixing child; ``(child pid, saved stdout, saved stderr)``."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the prefixer: drains until every writer has closed its end
        try:
            os.close(out_w)
            os.close(err_w)
            # torchrun signals the whole group on shutdown; the prefixer must outlive
            # the writer long enough to write its last lines.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _pump({out_r: 1, err_r: 2}, prefix.encode())
        finally:
            os._exit(0)
    os.close(out_r)
    os.close(err_r)
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    # Line-buffer Python's own streams: a line printed is a line in the pipe, even
    # if the process is killed right after.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return pid, saved_out, saved_err


def stop_prefixing(pid: int, saved_out: int, saved_err: int, timeout_s: float = 10.0) -> None:
    """Close the pipes and wait (bounded) until the prefixer has written everything."""
    import time

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.dup2(saved_out, 1)
    os.dup2(saved_err, 2)
    os.close(saved_out)
    os.close(saved_err)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        # Fine-grained: a warm job's next trial waits on this (``retarget_output``), and
        # the prefixer usually drains within a millisecond or two.
        time.sleep(0.001)


def write_to_log_target() -> None:
    """Point fds 1 and 2 at the log named by :data:`LOG_TARGET_ENV_VAR`, if one is named.

    A rank calls it before it prefixes its own output. Without the variable (a worker
    started by plain ``torchrun``), or when the log cannot be reopened, the rank keeps
    the output it inherited.
    """
    target = os.environ.get(LOG_TARGET_ENV_VAR)
    if not target:
        return
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# The prefixer of :func:`run_prefixed` while its body runs (prefix and handle), so
# :func:`retarget_output` can move it to another log.
_active: dict[str, object] = {}


def run_prefixed(prefix: str, body: Callable[[], int]) -> int:
    """``body()`` with this process's output prefixed by ``prefix``; its exit code.

    A ``SystemExit`` keeps its code; any other exception is printed (prefixed, while
    the prefixer still runs) and gives 1, as an uncaught exception would.
    """
    _active["prefix"] = prefix
    _active["handle"] = prefix_output(prefix)
    try:
        return body()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    finally:
        handle = _active.pop("handle")
        assert isinstance(handle, tuple)
        stop_prefixing(*handle)


def retarget_output(path: str) -> None:
    """Write this process's (prefixed) output to the file ``path`` from now on.

    A rank of a warm job calls it before each next trial, so every trial's lines land
    in that trial's own log. The running prefixer is told through each pipe (a marker
    line): what was written before goes to the old log, what comes after to ``path``.
    No new prefixer starts (forking a rank with torch loaded, and waiting for the old
    one to drain, cost a warm hand-over tens of milliseconds). What this process
    writes once its prefixing stops goes to ``path`` too.
    """
    fd = _open_log(path)
    handle = _active.get("handle")
    encoded = os.fsencode(path)
    if not isinstance(handle, tuple) or b"\n" in encoded:
        if isinstance(handle, tuple):
            # A path the marker's line cannot carry: a new prefixer writes to it.
            stop_prefixing(*handle)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if isinstance(handle, tuple):
            _active["handle"] = prefix_output(str(_active["prefix"]))
        return
    _, saved_out, saved_err = handle
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    marker = _RETARGET + encoded + b"\n"
    _write_all(1, marker)
    _write_all(2, marker)
    # Where output goes once the prefixer is stopped (``stop_prefixing`` restores these).
    os.dup2(fd, saved_out)
    os.dup2(fd, saved_err)
    os.close(fd)
