"""The operating-system processes of a trial: who they are, whether they live, ending them.

A trial attempt is a handful of processes: one ``torchrun`` per agent, and under each
of them one process per rank, which torch's elastic agent starts in a session of its
own (so signalling ``torchrun``'s process group misses them), each with a line
prefixer and perhaps DataLoader workers of its own. They are one unit: ending a trial
ends every one of them, and a slot is free only once all of them are gone.

A process is named by :class:`ProcessRef`: host, pid and the kernel's start time
(:func:`start_time`). Comparing the start time is what makes a pid safe to act on
after a driver crash: the pid of a long-dead rank may belong to someone else's process
by then. The same time is the process row's ``started_at``, compared with times the
database records. Every
process of an attempt also carries the attempt's launch token in its environment
(:data:`LAUNCH_TOKEN_ENV_VAR`), which finds processes whose pid was never recorded
(a driver killed between starting ``torchrun`` and writing its pid), and names the
folder each node's ``torchrun`` keeps its ranks' error files in
(:func:`torchrun_log_prefix`), so that a folder a killed ``torchrun`` left behind is
removed with the rest of its attempt (:func:`remove_torchrun_log_dirs`).

Only processes on this machine can be checked or signalled here; for a process on
another host :func:`is_alive` answers ``None`` (unknown), and its executor decides.

Example:
    >>> me = ProcessRef.of(os.getpid())
    >>> is_alive(me)
    True
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

LAUNCH_TOKEN_ENV_VAR = "SLOTSWEEP_LAUNCH_TOKEN"
#: What the name of a node's ``torchrun`` log folder starts with (in the temporary folder).
TORCHRUN_LOG_PREFIX = "slotsweep-torchrun-"
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Start times come from boot time and clock ticks; a clock adjustment can shift them a
# little (and rows written before start_time() existed are up to a second early),
# while a reused pid starts at least this much later.
_START_TIME_TOLERANCE_S = 1.0


def start_time(process: psutil.Process) -> float:
    """When ``process`` started, in seconds since the epoch, to the kernel's clock tick.

    The kernel counts a process's start in clock ticks since boot. psutil's
    ``create_time`` adds them to the boot time of ``/proc/stat``, which is whole
    seconds: up to a second early, enough to put a relaunch before the end of the
    attempt it replaced. The boot time is taken from the clocks instead (the wall
    clock less the time since boot, suspend included).

    Example:
        >>> abs(start_time(psutil.Process()) - time.time()) < 3600 * 24 * 365
        True
    """
    boot_clock = getattr(time, "CLOCK_BOOTTIME", None)
    if boot_clock is None:
        return float(process.create_time())
    booted = time.time() - time.clock_gettime(boot_clock)
    return float(process.create_time() - psutil.boot_time() + booted)


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine."""
    return host in _LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}


@dataclass(frozen=True)
class ProcessRef:
    """One process, named so that a reused pid is never mistaken for it."""

    host: str
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int, host: str | None = None) -> ProcessRef:
        """The reference of the live local process ``pid`` (raises if it is gone)."""
        return cls(host or socket.gethostname(), pid, start_time(psutil.Process(pid)))

    def same_as(self, other: ProcessRef) -> bool:
        """Whether ``other`` names the same process (a reused pid starts later).

        Start times of one process taken at two moments may differ a little (the boot
        time is read from the clocks each time), so they are compared with a tolerance.

        Example:
            >>> ProcessRef("h", 7, 100.0).same_as(ProcessRef("h", 7, 100.000004))
            True
            >>> ProcessRef("h", 7, 100.0).same_as(ProcessRef("h", 7, 160.0))
            False
        """
        return (
            self.host == other.host
            and self.pid == other.pid
            and abs(self.create_time - other.create_time) <= _START_TIME_TOLERANCE_S
        )

    def local_process(self) -> psutil.Process | None:
        """The live process this names on this machine, or None (gone or elsewhere)."""
        if not is_local_host(self.host):
            return None
        try:
            process = psutil.Process(self.pid)
            if not self.same_as(ProcessRef(self.host, self.pid, start_time(process))):
                return None  # the pid was reused
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        return process


def is_alive(ref: ProcessRef) -> bool | None:
    """True while ``ref`` runs; False once it is gone; None for another host's process."""
    if not is_local_host(ref.host):
        return None
    return ref.local_process() is not None


def pid_running(pid: int) -> bool:
    """Whether a local process ``pid`` runs (a zombie does not; a stopped one does).

    Without its start time a reused pid counts as running: callers use it where
    "running" is the cautious answer.
    """
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def processes_with_token(token: str) -> list[psutil.Process]:
    """Live local processes whose environment carries launch token ``token``."""
    found = []
    for process in psutil.process_iter():
        try:
            if (
                process.environ().get(LAUNCH_TOKEN_ENV_VAR) == token
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _with_descendants(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    seen: dict[int, psutil.Process] = {}
    for process in processes:
        seen.setdefault(process.pid, process)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            for child in process.children(recursive=True):
                seen.setdefault(child.pid, child)
    return list(seen.values())


def _signal(process: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        # A session or group leader takes its whole group with it (the rank's line
        # prefixer, DataLoader workers), including members already reparented.
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, sig)
        process.send_signal(sig)


def _living(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            living.append(process)
    return living


def end_processes(
    refs: Iterable[ProcessRef],
    *,
    token: str | None = None,
    grace_s: float = 10.0,
    kill_wait_s: float = 10.0,
) -> list[psutil.Process]:
    """End ``refs``, every process of launch ``token`` and all their descendants.

    SIGTERM first (rank 0 commits what it queued, ``torchrun`` passes it on), SIGKILL
    for whatever is left after ``grace_s`` (0 kills at once). Returns the local
    processes still alive ``kill_wait_s`` after SIGKILL (normally none: a process
    in uninterruptible sleep can outlast it); the caller must not free their slots.
    Once none of launch ``token``'s processes is left, neither is its ``torchrun`` log
    folder (:func:`remove_torchrun_log_dirs`).
    """
    roots = [p for p in (ref.local_process() for ref in refs) if p is not None]
    if token is not None:
        roots.extend(processes_with_token(token))
    survivors = _living(_with_descendants(roots))
    if survivors:
        if grace_s > 0:
            for process in survivors:
                _signal(process, signal.SIGTERM)
            survivors = _wait_gone(_with_descendants(survivors), grace_s)
        for process in survivors:
            _signal(process, signal.SIGKILL)
        survivors = _wait_gone(survivors, kill_wait_s)
    if token is not None and not survivors:
        remove_torchrun_log_dirs(token)
    return survivors


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    living = _living(processes)
    while living and time.monotonic() < deadline:
        time.sleep(0.05)
        living = _living(living)
    return living


def torchrun_log_prefix(token: str | None) -> str:
    """What the name of the ``torchrun`` log folder of attempt ``token`` starts with.

    Example:
        >>> torchrun_log_prefix("5f0c")
        'slotsweep-torchrun-5f0c-'
        >>> torchrun_log_prefix(None)  # a wrapper started by hand, with no attempt
        'slotsweep-torchrun-'
    """
    return f"{TORCHRUN_LOG_PREFIX}{token}-" if token else TORCHRUN_LOG_PREFIX


def remove_torchrun_log_dirs(token: str) -> list[Path]:
    """Remove the ``torchrun`` log folders of attempt ``token`` from this machine's
    temporary folder; the folders removed.

    A node's ``torchrun`` wrapper removes its own folder when ``torchrun`` returns; one
    that was SIGKILLed (a driver ending a hung attempt, the kernel's OOM killer) cannot,
    and without this one folder would stay behind per such attempt. Called once every
    process of the attempt on this machine has exited.

    Example:
        >>> remove_torchrun_log_dirs("no-such-attempt")
        []
    """
    pattern = os.path.join(tempfile.gettempdir(), glob.escape(torchrun_log_prefix(token)) + "*")
    removed = []
    for name in glob.glob(pattern):
        shutil.rmtree(name, ignore_errors=True)
        removed.append(Path(name))
    return removed
