"""A real multi-node Slurm cluster on this machine, for tests: ``.ci/slurm.sh`` from Python.

Registered as a pytest plugin by ``tests/conftest.py``, so every test may ask for:

- ``slurm_cluster`` (session): two nodes ``ssnode1`` and ``ssnode2``, 2 CPUs and 2 fake
  GPUs each, partitions ``debug`` (default) and ``urgent`` (preempts ``debug`` jobs by
  requeueing them). Each node is a network namespace with its own address and host
  name; slurmctld, munged and the test process share the bridge address
  (:attr:`SlurmCluster.controller_address`). Run Slurm's clients with
  :meth:`SlurmCluster.run` or :meth:`SlurmCluster.popen`, or add
  :attr:`SlurmCluster.env` to a client's environment. The files are shared (one
  machine), so a job may write into a test's ``tmp_path``.
- ``slurm_postgres`` (session): a PostgreSQL server that processes on the nodes reach,
  at :attr:`PostgresServer.url` (the controller address).

A test that loses a node (:meth:`SlurmCluster.stop_node`) starts it again before it
ends, and a test cancels the jobs it submits: the cluster is shared by the session.
There is no slurmdbd, so no ``sacct``: a finished job's state comes from
:meth:`SlurmCluster.job` (``scontrol show job``, kept 600 s). Root only (network
namespaces, Slurm's daemons); the fixtures skip otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    REPO_ROOT,
    PostgresServer,
    cannot_run_here,
    fresh_database,
    released_after_group,
)

SLURM_SCRIPT = REPO_ROOT / ".ci" / "slurm.sh"


class SlurmClusterError(RuntimeError):
    """``.ci/slurm.sh`` failed; the message holds the end of its output."""


class SlurmCluster:
    """A cluster of real Slurm daemons (one slurmd per network namespace) on this machine.

    :meth:`start` creates it in :attr:`conf_dir` (a new temporary folder unless given),
    :meth:`stop` stops every daemon by PID and removes the namespaces and the folder.
    """

    def __init__(
        self, node_count: int = 2, gpus_per_node: int = 2, conf_dir: Path | None = None
    ) -> None:
        self.node_count = node_count
        self.gpus_per_node = gpus_per_node
        self.conf_dir = conf_dir or Path(tempfile.mkdtemp(prefix="slotsweep-slurm-"))
        #: What a Slurm client needs in its environment (``SLURM_CONF``).
        self.env: dict[str, str] = {}
        #: (host name, address) of each node, in order: ssnode1, ssnode2, ...
        self.nodes: list[tuple[str, str]] = []
        #: The bridge address: slurmctld's, and this machine's as the nodes see it.
        self.controller_address = ""
        #: The nodes' subnet, e.g. ``10.213.7.0/24``.
        self.subnet = ""

    def _script(self, action: str, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            ["bash", str(SLURM_SCRIPT), action, str(self.conf_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise SlurmClusterError(
                f"slurm.sh {action} failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}"
            )
        return done.stdout

    def start(self) -> None:
        """Start the daemons (installing Slurm and munge first when missing); wait for idle nodes."""
        # The first start may apt-get install slurm-wlm and munge (about 15 s).
        self._script("start", str(self.node_count), str(self.gpus_per_node), timeout=600)
        self.env = read_assignments(self.conf_dir / "env")
        cluster = read_assignments(self.conf_dir / "cluster")
        self.controller_address = cluster["SLOTSWEEP_SLURM_CONTROLLER"]
        self.subnet = cluster["SLOTSWEEP_SLURM_SUBNET"]
        self.nodes = node_addresses(cluster["SLOTSWEEP_SLURM_NODES"])

    def stop(self) -> None:
        """Cancel the jobs, stop every daemon by PID, remove the network and the folder."""
        try:
            self._script("stop")
        finally:
            shutil.rmtree(self.conf_dir, ignore_errors=True)

    def stop_node(self, name: str) -> None:
        """Lose a node as in a power cut: SIGKILL its slurmd, slurmstepds and job processes.

        slurmctld notices after SlurmdTimeout (10 s): sinfo shows the node as not
        responding (``*``) within about 20 s and ``down*`` within about 30 s, when its
        batch jobs are requeued.
        """
        self._script("node-stop", name)

    def start_node(self, name: str) -> None:
        """Start a lost node's slurmd again; return once slurmctld has it back in service."""
        self._script("node-start", name, timeout=120)

    def client_env(self) -> dict[str, str]:
        """This process's environment for a Slurm client: :attr:`env` added, no foreign SLURM_*.

        A ``SLURM_JOB_ID`` (say, from a pytest run inside a job on another cluster) would
        make srun look for that job here.
        """
        env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        env.update(self.env)
        return env

    def run(
        self, *argv: str, timeout: float = 120, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``srun``, ``sbatch``, ``squeue``...) to its end; text output."""
        return subprocess.run(
            list(argv),
            env=self.client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *argv: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        """Start a Slurm client command (e.g. a long ``srun``) without waiting; text pipes."""
        return subprocess.Popen(
            list(argv),
            env=self.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
        )

    def allocate(self, *, nodes: int = 2, no_kill: bool = True, name: str = "slotsweep") -> str:
        """Allocate ``nodes`` whole nodes (``salloc --no-shell``); the job id.

        ``no_kill`` (``--no-kill``): a lost node leaves the allocation instead of
        ending it. The caller cancels the job (``scancel``) when done.
        """
        flags = ["--no-kill"] if no_kill else []
        done = self.run(
            "salloc", f"-N{nodes}", "--exclusive", "--no-shell", *flags, "-J", name, timeout=120
        )
        match = re.search(r"Granted job allocation (\d+)", done.stderr)
        if match is None:
            raise SlurmClusterError(f"salloc failed: {done.stderr.strip()}")
        return match.group(1)

    def allocation_env(self, job_id: str) -> dict[str, str]:
        """What ``salloc CMD`` gives CMD: the client settings and the job's SLURM_* values."""
        job = self.job(job_id)
        nodes, cpus = int(job["NumNodes"]), int(job["NumCPUs"])
        return {
            **self.env,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NODELIST": job["NodeList"],
            "SLURM_JOB_CPUS_PER_NODE": f"{cpus // nodes}(x{nodes})",
        }

    def node_state(self, name: str) -> str:
        """The node's state as sinfo's ``%t`` shows it: ``idle``, ``alloc``, ``down*``...

        A trailing ``*`` means slurmctld gets no answer from the node's slurmd.
        """
        done = self.run("sinfo", "-h", "-N", "-n", name, "-o", "%t", timeout=30)
        lines = done.stdout.split()
        return lines[0] if lines else ""

    def job(self, job_id: str | int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, Restarts, NodeList...).

        Empty once slurmctld has forgotten the job (MinJobAge, 600 s after its end).
        """
        done = self.run("scontrol", "-o", "show", "job", str(job_id), timeout=30)
        if done.returncode != 0:
            return {}
        # Keys are words, some with a colon (``AllocNode:Sid=``); values may hold spaces.
        return dict(re.findall(r"([\w:]+)=(.*?)(?= [\w:]+=|$)", done.stdout.strip()))

    @contextlib.contextmanager
    def port_taken(self, name: str, port: int) -> Iterator[None]:
        """Listen on ``port`` of node ``name`` inside the ``with`` block, as a process of its own.

        Whatever on that node wants to bind the port meanwhile fails with ``EADDRINUSE``.
        """
        slot = (self.conf_dir / "slot").read_text().strip()
        holder = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/ssw{slot}-{name}", sys.executable, "-c", _LISTEN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PORT": str(port)},
        )
        try:
            assert holder.stdout is not None
            listening = holder.stdout.readline().strip()
            if listening != "listening":
                raise SlurmClusterError(f"could not take port {port} on {name}: {listening!r}")
            yield
        finally:
            holder.kill()
            holder.communicate()

    def wait_node_state(self, name: str, pattern: str, timeout: float = 60) -> str:
        """Wait until the node's state matches the regular expression; return that state."""
        deadline = time.monotonic() + timeout
        state = self.node_state(name)
        while not re.fullmatch(pattern, state):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} is {state!r} after {timeout} s, not {pattern!r}")
            time.sleep(0.5)
            state = self.node_state(name)
        return state


# Binds and listens on $PORT until its stdin closes (:meth:`SlurmCluster.port_taken`).
_LISTEN = (
    "import os, socket, sys; s = socket.socket(); "
    # A trial of an earlier test may have left connections to the port in TIME_WAIT.
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind(('', int(os.environ['PORT']))); "
    "s.listen(); print('listening', flush=True); sys.stdin.read()"
)


def read_assignments(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a file that ``.ci/slurm.sh`` or ``.ci/ray.sh`` wrote."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def node_addresses(value: str) -> list[tuple[str, str]]:
    """``name:address,name:address`` (the scripts' node list) as pairs."""
    return [(name, address) for name, address in (pair.split(":") for pair in value.split(","))]


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A two-node Slurm cluster for the whole session; every daemon stopped by PID at the end."""
    if os.geteuid() != 0:
        cannot_run_here("a Slurm cluster on network namespaces needs root")
    cluster = SlurmCluster()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    stop = released_after_group("slurm", cluster.stop)
    try:
        yield cluster
    finally:
        stop()


@pytest.fixture(scope="session")
def slurm_postgres(slurm_cluster: SlurmCluster) -> Iterator[PostgresServer]:
    """A PostgreSQL server on the controller address, which jobs on the nodes can reach.

    Its ``url`` (``postgresql://slotsweep@<controller>:<port>/slotsweep``) works from the
    nodes and from the test; it trusts the nodes' subnet and 127.0.0.1 only.
    """
    prefix = slurm_cluster.subnet.split("/")[1]
    server = PostgresServer(listen_address=f"{slurm_cluster.controller_address}/{prefix}")
    server.start()
    remove = released_after_group("slurm", server.remove)
    try:
        yield server
    finally:
        remove()


@pytest.fixture
def slurm_database(slurm_postgres: PostgresServer) -> Iterator[str]:
    """A fresh database of the test's own on the nodes' PostgreSQL server (its URL)."""
    yield from fresh_database(slurm_postgres.url)
