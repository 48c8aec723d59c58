"""Start a placed trial as ``torchrun`` processes, one per agent of its placement.

Building the command lines is pure (:func:`torchrun_commands`); :func:`start_trial`
is the I/O edge. A single-agent trial uses ``--standalone``; a multi-agent trial starts
one ``torchrun`` per agent with c10d rendezvous on the first agent's host, a free
port and a shared ``--rdzv-id``. c10d hands out node ranks in arrival order (it
ignores ``--node_rank``), which is why ranks prefix their own log lines.

Every agent of one placement must be reachable from this machine's process table:
the local executor starts processes on this machine only, so agents on other hosts
are refused with a clear error.

The processes of one attempt are one unit (:mod:`trials.launch.processes`): each carries the
attempt's launch token, stopping the attempt ends ``torchrun`` and every rank under it,
and the ranks themselves die with their ``torchrun`` (see :mod:`trials.node.worker`).
The database URL reaches the ranks through the environment
(:data:`DB_URL_ENV_VAR`), never through a file or a command line.

``torchrun`` runs under :mod:`trials.node.torchrun`, which calls its ``main`` in-process
(so the process recorded as ``torchrun`` is torchrun), forks the ranks from it (torch
imported once per node, not once per rank) and prefixes torchrun's own log lines with
``[torchrun] ``, as the ranks prefix theirs with ``[rank N] ``.

Ports are picked free when an attempt starts (the rendezvous port here, the ranks'
``MASTER_PORT`` by torchrun), so another process may take one before it is bound. The
attempt then fails at start-up with ``EADDRINUSE`` (:func:`says_address_in_use`), and
the driver starts the trial again at once, with fresh ports, counting no restart.
Which node hosts the c10d store is said, not guessed (:data:`RDZV_CONF_ENV_VAR`):
torchrun's guess falls back to joining whatever holds a taken port as a client, and
waits a minute for it instead of failing at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import ValidationError

if TYPE_CHECKING:
    from trials.scheduler import Placement

from trials.config import RuntimeSpec, validation_problems
from trials.launch.processes import (
    LAUNCH_TOKEN_ENV_VAR,
    ProcessRef,
    end_processes,
    is_local_host,
    remove_torchrun_log_dirs,
)
from trials.launch.shares import share_environment

SPEC_ENV_VAR = "SLOTSWEEP_TRIAL_SPEC"
DB_URL_ENV_VAR = "SLOTSWEEP_DB_URL"
SLOTS_ENV_VAR = "SLOTSWEEP_SLOTS"
AGENT_ENV_VAR = "SLOTSWEEP_AGENT"
#: "1": the trial's processes take SIGTERM as "checkpoint and stop" (a cluster engine's
#: warning before it kills a job; see :mod:`trials.runtime._signals`).
CHECKPOINT_ON_SIGTERM_ENV_VAR = "SLOTSWEEP_CHECKPOINT_ON_SIGTERM"
#: torchrun's ``--rdzv-conf`` from the environment: set per node of a multi-node
#: attempt to :func:`rendezvous_conf`, since every node may run the same command line.
RDZV_CONF_ENV_VAR = "PET_RDZV_CONF"


@dataclass(frozen=True)
class NodeCommand:
    """One agent's ``torchrun`` invocation."""

    agent: str
    host: str
    slots: tuple[int, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def torchrun_args(
    *, nnodes: int, nproc_per_node: int, rdzv_endpoint: str | None, rdzv_id: str
) -> tuple[str, ...]:
    """One node's ``torchrun`` arguments, running :mod:`trials.node.worker` on every rank.

    ``rdzv_endpoint`` is ``host:port`` of the first node when ``nnodes`` > 1 (None:
    torchrun reads ``PET_RDZV_ENDPOINT``, which a node wrapper sets once the nodes are
    known); a single node uses ``--standalone``. Every executor builds its commands here; the
    program before them is ``python -m trials.node.torchrun`` (torchrun run by a wrapper
    that prefixes its own lines with ``[torchrun]``), or a wrapper of the executor's.

    Example:
        >>> torchrun_args(nnodes=1, nproc_per_node=2, rdzv_endpoint=None, rdzv_id="t")[:2]
        ('--standalone', '--nnodes=1')
    """
    if nnodes == 1:
        rendezvous: tuple[str, ...] = ("--standalone", "--nnodes=1")
    else:
        endpoint = () if rdzv_endpoint is None else (f"--rdzv-endpoint={rdzv_endpoint}",)
        rendezvous = (
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            *endpoint,
            f"--rdzv-id={rdzv_id}",
        )
    return (
        *rendezvous,
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
        "-m",
        "trials.node.worker",
    )


def ranks_per_node(args: Sequence[str]) -> int:
    """The ranks per node in one node's ``torchrun`` arguments (:func:`torchrun_args`).

    Example:
        >>> args = torchrun_args(nnodes=1, nproc_per_node=2, rdzv_endpoint=None, rdzv_id="t")
        >>> ranks_per_node(args)
        2
        >>> ranks_per_node(["--standalone"])
        1
    """
    value = next((a.split("=", 1)[1] for a in args if a.startswith("--nproc-per-node=")), "1")
    return int(value)


def gpu_environment(slots: Sequence[int]) -> dict[str, str]:
    """The environment that gives a node's ranks exactly the GPUs ``slots`` name.

    Slots are NVML indices (:func:`trials._system_metrics.detect_gpus`), which follow the
    PCI bus order; CUDA numbers ``CUDA_VISIBLE_DEVICES`` fastest first unless told
    otherwise, so on a machine with GPUs of different kinds slot 0 could be another
    physical GPU than CUDA's 0.

    Example:
        >>> gpu_environment((2, 3))
        {'CUDA_DEVICE_ORDER': 'PCI_BUS_ID', 'CUDA_VISIBLE_DEVICES': '2,3'}
    """
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(slot) for slot in slots),
    }


def rendezvous_conf(*, hosts_store: bool) -> str:
    """One node's ``--rdzv-conf``: whether it hosts the c10d store (the endpoint's node).

    Example:
        >>> rendezvous_conf(hosts_store=True)
        'is_host=1'
    """
    return f"is_host={int(hosts_store)}"


def torchrun_commands(
    placement: Placement,
    *,
    rdzv_id: str,
    rdzv_port: int | None = None,
    use_gpus: bool = False,
    mps: bool = False,
    python: str = sys.executable,
) -> list[NodeCommand]:
    """The ``torchrun`` command and extra environment of every agent in ``placement``.

    A placement on a share of one slot adds its share (and, on GPUs with CUDA MPS
    running, ``mps``, its share of the GPU's threads): :mod:`trials.launch.shares`.

    Example:
        >>> from trials.scheduler import AgentSlots, Placement
        >>> placement = Placement("t1", pool.name, (AgentSlots(pool.agents[0], (0, 1)),))
        >>> cmds = torchrun_commands(placement, rdzv_id="t1", python="/usr/bin/python3")
        >>> cmds[0].argv[:4]
        ('/usr/bin/python3', '-m', 'trials.node.torchrun', '--standalone')
    """
    nodes = placement.agents
    if not nodes:
        raise ValueError("a placement needs at least one agent")
    if len(nodes) > 1 and rdzv_port is None:
        raise ValueError("a multi-agent placement needs rdzv_port")
    endpoint = f"{nodes[0].agent.host}:{rdzv_port}" if len(nodes) > 1 else None
    commands = []
    for index, node in enumerate(nodes):
        env = {
            AGENT_ENV_VAR: node.agent.name,
            SLOTS_ENV_VAR: ",".join(str(s) for s in node.slots),
        }
        if len(nodes) > 1:
            env[RDZV_CONF_ENV_VAR] = rendezvous_conf(hosts_store=index == 0)
        if use_gpus:
            env.update(gpu_environment(node.slots))
        env.update(share_environment(placement.share, use_gpus=use_gpus, mps=mps))
        argv = (
            python,
            "-m",
            "trials.node.torchrun",
            *torchrun_args(
                nnodes=len(nodes),
                nproc_per_node=len(node.slots),
                rdzv_endpoint=endpoint,
                rdzv_id=rdzv_id,
            ),
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


_ADDRESS_IN_USE = ("eaddrinuse", "address already in use")


def says_address_in_use(message: str) -> bool:
    """Whether an error's ``message`` says a port it wanted to bind was taken (errno 98).

    Example:
        >>> says_address_in_use("The server socket has failed to listen on any local "
        ...     "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE")
        True
    """
    text = message.lower()
    return any(words in text for words in _ADDRESS_IN_USE)


class SpecUnreadableError(ValueError):
    """The trial's spec is missing from the environment or invalid; ``problems`` says why."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        #: One line per problem, each naming the variable.
        self.problems = list(problems)


def spec_from_environment(environ: Mapping[str, str] | None = None) -> RuntimeSpec:
    """The trial's spec as the launcher hands it over: :data:`SPEC_ENV_VAR` (JSON) with
    the database URL from :data:`DB_URL_ENV_VAR`.

    Raises :class:`SpecUnreadableError` when it is missing or invalid.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(SPEC_ENV_VAR)
    if not text:
        raise SpecUnreadableError(
            [f"{SPEC_ENV_VAR}: not set; it must hold the trial's RuntimeSpec as JSON"]
        )
    try:
        fields = json.loads(text)
    except ValueError as error:
        raise SpecUnreadableError([f"{SPEC_ENV_VAR}: not JSON: {error}"]) from None
    if environ.get(DB_URL_ENV_VAR) and isinstance(fields, dict):
        fields["db_url"] = environ[DB_URL_ENV_VAR]
    try:
        return RuntimeSpec.model_validate(fields)
    except ValidationError as error:
        problems = validation_problems(error, RuntimeSpec)
        raise SpecUnreadableError([f"{SPEC_ENV_VAR}: {problem}" for problem in problems]) from None


@dataclass
class TrialProcesses:
    """The running ``torchrun`` processes of one trial attempt (this driver's children)."""

    commands: Sequence[NodeCommand]
    processes: list[subprocess.Popen[bytes]]
    refs: list[ProcessRef]
    token: str
    _log_dirs_removed: bool = field(default=False, init=False, repr=False)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def poll(self) -> int | None:
        """None while any agent still runs; else the first non-zero exit code, or 0.

        Once every ``torchrun`` has exited, what a killed one left in the temporary
        folder is removed (:func:`~trials.launch.processes.remove_torchrun_log_dirs`).
        """
        codes = [p.poll() for p in self.processes]
        if any(code is None for code in codes):
            # One failed agent dooms the gang: the others would wait for it forever.
            if any(code not in (None, 0) for code in codes):
                self.end(grace_s=0.0)
            return None
        self._remove_log_dirs()
        return next((code for code in codes if code != 0), 0)

    def end(self, *, grace_s: float = 10.0) -> bool:
        """End every process of the attempt (ranks included); whether all are gone.

        Blocks until they are gone (up to ``grace_s`` for SIGTERM plus a bounded wait
        after SIGKILL), and reaps the ``torchrun`` children.
        """
        survivors = end_processes(self.refs, token=self.token, grace_s=grace_s)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)
        return not survivors

    def _remove_log_dirs(self) -> None:
        # Asked at every poll once the attempt is over: look in the folder once.
        if not self._log_dirs_removed:
            self._log_dirs_removed = True
            remove_torchrun_log_dirs(self.token)

    def describe(self) -> list[dict[str, Any]]:
        """Where each agent's ``torchrun`` runs, for the trial run's record."""
        return [
            {"agent": c.agent, "host": c.host, "slots": list(c.slots), "pid": p.pid}
            for c, p in zip(self.commands, self.processes, strict=True)
        ]


def start_trial(
    commands: Sequence[NodeCommand],
    *,
    log_path: Path,
    cwd: Path,
    token: str,
    extra_env: Mapping[str, str] | None = None,
) -> TrialProcesses:
    """Start every agent's ``torchrun`` with output appended to the trial's log file.

    Each process leads its own session so that Ctrl-C in the driver's terminal does not
    reach it (the driver decides how trials stop), and carries launch ``token`` in its
    environment so that every process of the attempt can be found again, even by a
    later driver that never learnt the pids. ``extra_env`` is where secrets go (the
    database URL): the environment is readable by the process's owner only.
    """
    for command in commands:
        if not is_local_host(command.host):
            raise RuntimeError(
                f"agent '{command.agent}' is on host '{command.host}'; the local executor "
                "starts processes on this machine only"
            )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    refs: list[ProcessRef] = []
    base_env = trial_environment(token, extra_env or {})
    try:
        for command in commands:
            log: TextIO
            with open(log_path, "a", buffering=1) as log:
                process = subprocess.Popen(
                    list(command.argv),
                    cwd=cwd,
                    env={**base_env, **command.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            processes.append(process)
            # Not yet reaped, so even a process that exited at once still has its entry.
            refs.append(ProcessRef.of(process.pid, host=command.host))
    except BaseException:
        TrialProcesses(commands, processes, refs, token).end(grace_s=0.0)
        raise
    return TrialProcesses(commands, processes, refs, token)


def trial_environment(token: str, extra_env: Mapping[str, str]) -> dict[str, str]:
    """The environment every process of an attempt starts with, whichever executor starts it.

    This process's environment, the defaults trials run best with, ``extra_env`` (the
    spec, the database URL) and the attempt's launch token.
    """
    env = dict(os.environ)
    # In-place torchrun restarts are off, but sharing the rendezvous store still
    # made gloo's connectFullMesh flaky on loopback.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torchrun sets this for multi-process nodes anyway, with a banner in every log.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env)
    env[LAUNCH_TOKEN_ENV_VAR] = token
    return env


DRIVER_LOG_PREFIX = "[slotsweep] "


def write_log_line(log_path: Path, message: str) -> None:
    """Append ``message`` to a trial's log as the driver's line (``[slotsweep] ...``).

    Every line of a trial log says who wrote it: ranks prefix theirs with ``[rank N]``,
    torchrun's come with ``[torchrun]``. One ``write`` per call, in append mode, so a
    line never splits another process's line in two.
    """
    text = "".join(f"{DRIVER_LOG_PREFIX}{line}\n" for line in message.splitlines() or [""])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
