"""Start a placed trial as ``torchrun`` processes, one per agent of its placement.

Building the command lines is pure (:func:`torchrun_commands`); :func:`start_trial`
is the I/O edge. A single-agent trial uses ``--standalone``; a multi-agent trial starts
one ``torchrun`` per agent with c10d rendezvous on the first agent's host, a free
port and a shared ``--rdzv-id``. c10d hands out node ranks in arrival order (it
ignores ``--node_rank``), which is why ranks prefix their own log lines.

Every agent of one placement must be reachable from this machine's process table:
the local executor starts processes on this machine only, so agents on other hosts
are refused with a clear error (multi-machine execution is Ray's job).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from trials.scheduler import Placement

SPEC_ENV_VAR = "SLOTSWEEP_TRIAL_SPEC"
_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine."""
    return host in _LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}


@dataclass(frozen=True)
class NodeCommand:
    """One agent's ``torchrun`` invocation."""

    agent: str
    host: str
    slots: tuple[int, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def torchrun_commands(
    placement: Placement,
    *,
    spec_path: str,
    rdzv_id: str,
    rdzv_port: int | None = None,
    use_gpus: bool = False,
    python: str = sys.executable,
) -> list[NodeCommand]:
    """The ``torchrun`` command and extra environment of every agent in ``placement``.

    Example:
        >>> cmds = torchrun_commands(placement, spec_path="/tmp/s.json", rdzv_id="t1")  # doctest: +SKIP
        >>> cmds[0].argv[:4]  # doctest: +SKIP
        ('/usr/bin/python3', '-m', 'torch.distributed.run', '--standalone')
    """
    nodes = placement.agents
    if not nodes:
        raise ValueError("a placement needs at least one agent")
    base = (python, "-m", "torch.distributed.run")
    if len(nodes) == 1:
        rendezvous: tuple[str, ...] = ("--standalone", "--nnodes=1")
    else:
        if rdzv_port is None:
            raise ValueError("a multi-agent placement needs rdzv_port")
        rendezvous = (
            f"--nnodes={len(nodes)}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={nodes[0].agent.host}:{rdzv_port}",
            f"--rdzv-id={rdzv_id}",
        )
    commands = []
    for node in nodes:
        env = {SPEC_ENV_VAR: spec_path, "SLOTSWEEP_AGENT": node.agent.name}
        if use_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s) for s in node.slots)
        argv = (
            *base,
            *rendezvous,
            f"--nproc-per-node={len(node.slots)}",
            "--max-restarts=0",
            "-m",
            "trials.worker",
        )
        commands.append(
            NodeCommand(
                agent=node.agent.name, host=node.agent.host, slots=node.slots, argv=argv, env=env
            )
        )
    return commands


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class TrialProcesses:
    """The running ``torchrun`` processes of one trial attempt."""

    commands: Sequence[NodeCommand]
    processes: list[subprocess.Popen[bytes]]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def poll(self) -> int | None:
        """None while any agent still runs; else the first non-zero exit code, or 0."""
        codes = [p.poll() for p in self.processes]
        if any(code is None for code in codes):
            # One failed agent dooms the gang: the others would wait for it forever.
            if any(code not in (None, 0) for code in codes):
                self.terminate()
            return None
        return next((code for code in codes if code != 0), 0)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Signal every process group of the trial (torchrun and its ranks)."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)

    def wait(self, timeout: float | None = None) -> int | None:
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout)
        return self.poll()

    def describe(self) -> list[dict[str, Any]]:
        """What the database keeps to find these processes again after a driver crash."""
        return [
            {"agent": c.agent, "host": c.host, "slots": list(c.slots), "pid": p.pid}
            for c, p in zip(self.commands, self.processes, strict=True)
        ]


def start_trial(
    commands: Sequence[NodeCommand],
    *,
    log_path: Path,
    cwd: Path,
    extra_env: Mapping[str, str] | None = None,
) -> TrialProcesses:
    """Start every agent's ``torchrun`` with output appended to the trial's log file.

    Each process leads its own session so a whole trial (torchrun and its ranks) can be
    signalled at once, and so Ctrl-C in the driver's terminal does not reach it: the
    driver decides how trials stop.
    """
    for command in commands:
        if not is_local_host(command.host):
            raise RuntimeError(
                f"agent '{command.agent}' is on host '{command.host}'; the local executor "
                "starts processes on this machine only"
            )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    processes = []
    base_env = dict(os.environ)
    # In-place torchrun restarts are off, but sharing the rendezvous store still
    # made gloo's connectFullMesh flaky on loopback.
    base_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    # torchrun sets this for multi-process nodes anyway, with a banner in every log.
    base_env.setdefault("OMP_NUM_THREADS", "1")
    base_env.update(extra_env or {})
    try:
        for command in commands:
            log: TextIO
            with open(log_path, "a", buffering=1) as log:
                processes.append(
                    subprocess.Popen(
                        list(command.argv),
                        cwd=cwd,
                        env={**base_env, **command.env},
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
    except BaseException:
        TrialProcesses(commands, processes).terminate(signal.SIGKILL)
        raise
    return TrialProcesses(commands, processes)


def kill_leftover(pid: int, marker: str) -> bool:
    """End a process group left by a dead driver, if ``pid`` still runs ``marker``.

    The command-line check guards against a recycled pid belonging to someone else.
    """
    try:
        import psutil

        cmdline = " ".join(psutil.Process(pid).cmdline())
        environ = psutil.Process(pid).environ()
    except Exception:
        return False
    if "torch.distributed.run" not in cmdline or environ.get(SPEC_ENV_VAR, "") != marker:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return True
