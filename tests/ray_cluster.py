"""A real multi-node Ray cluster on this machine, for tests: ``.ci/ray.sh`` from Python.

Registered as a pytest plugin by ``tests/conftest.py``, so every test may ask for:

- ``ray_cluster`` (session): a head ``rayhead`` (no CPUs: no trial runs there) and two
  worker nodes ``raynode1`` and ``raynode2`` with 2 CPUs each, every node a network
  namespace with its own address and host name. A driver reaches it through Ray Client
  at :attr:`RayCluster.address`; :meth:`RayCluster.cluster_file` writes the cluster
  file of a search on it.
- ``ray_postgres`` (session): a PostgreSQL server on the bridge address, which the
  ranks on the nodes reach; ``ray_database``: a fresh database of the test's own there.

A test that loses a node (:meth:`RayCluster.stop_node`) starts it again before it ends.
Root only (network namespaces); the fixtures skip otherwise, and where ``ray`` is not
installed (the extra ``slotsweep[ray]``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    REPO_ROOT,
    PostgresServer,
    cannot_run_here,
    cli_environment,
    fresh_database,
    released_after_group,
)
from tests.slurm_cluster import node_addresses, read_assignments

RAY_SCRIPT = REPO_ROOT / ".ci" / "ray.sh"


class RayClusterError(RuntimeError):
    """``.ci/ray.sh`` failed; the message holds the end of its output."""


class RayCluster:
    """A Ray cluster of three nodes (one per network namespace) on this machine.

    :meth:`start` creates it in :attr:`conf_dir` (a new temporary folder unless given),
    :meth:`stop` stops every node by its session id and removes the namespaces and the
    folder.
    """

    def __init__(self, conf_dir: Path | None = None) -> None:
        self.conf_dir = conf_dir or Path(tempfile.mkdtemp(prefix="slotsweep-ray-"))
        #: ``ray://<head>:10001``: where a driver outside the namespaces connects.
        self.address = ""
        #: (host name, address) of each node: rayhead, raynode1, raynode2.
        self.nodes: list[tuple[str, str]] = []
        #: The bridge address: this machine's as the nodes see it.
        self.controller_address = ""
        #: The nodes' subnet, e.g. ``10.214.7.0/24``.
        self.subnet = ""

    def _script(self, action: str, *args: str, timeout: float = 300) -> str:
        env = {**os.environ, "SLOTSWEEP_RAY": str(Path(sys.executable).parent / "ray")}
        done = subprocess.run(
            ["bash", str(RAY_SCRIPT), action, str(self.conf_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        if done.returncode != 0:
            raise RayClusterError(
                f"ray.sh {action} failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}"
            )
        return done.stdout

    def start(self) -> None:
        """Start the head and both workers; return once Ray lists all three alive."""
        self._script("start", timeout=600)
        env = read_assignments(self.conf_dir / "env")
        cluster = read_assignments(self.conf_dir / "cluster")
        self.address = env["RAY_ADDRESS"]
        self.controller_address = cluster["SLOTSWEEP_RAY_CONTROLLER"]
        self.subnet = cluster["SLOTSWEEP_RAY_SUBNET"]
        self.nodes = node_addresses(cluster["SLOTSWEEP_RAY_NODES"])

    def stop(self) -> None:
        """Stop every node by session id, remove the network and the folder."""
        try:
            self._script("stop")
        finally:
            shutil.rmtree(self.conf_dir, ignore_errors=True)

    def stop_node(self, name: str) -> None:
        """Lose a node as in a power cut: SIGKILL its raylet, workers and their torchrun.

        The head marks it dead within about 5 s (fast health checks); calls to its
        actors fail at once.
        """
        self._script("node-stop", name)

    def start_node(self, name: str) -> None:
        """Start a lost node again (a new Ray node id); return once Ray lists it alive."""
        self._script("node-start", name, timeout=300)

    def on_node(self, name: str) -> tuple[str, ...]:
        """The command prefix that runs a command in node ``name``'s network namespace
        (``.ci/ray.sh`` names it ``rsw<slot>-<node>``), as if on that machine."""
        slot = (self.conf_dir / "slot").read_text().strip()
        return ("nsenter", f"--net=/run/netns/rsw{slot}-{name}")

    def other_job(self, **holders: dict[str, object]) -> OtherRayJob:
        """Another Ray job (a driver of its own) holding resources on the cluster until
        released: one idle actor per keyword, with those ``ray.remote`` options.

        Example: ``cluster.other_job(cpus={"num_cpus": 2, "resources": {"host_raynode2": 1}})``
        holds raynode2's two CPUs.
        """
        return OtherRayJob(self.address, holders)

    def leftover_actors(self) -> list[str]:
        """The names of slotsweep's actors alive on the cluster now (asked from a new client)."""
        with self.actor_lister() as names:
            return names()

    def actor_lister(self) -> ActorLister:
        """A Ray client connected now that lists slotsweep's live actors when called.

        Connecting takes seconds on a loaded machine: a test that must look right after
        an event (before Ray's own 30 s clean-up of a dead driver's actors) connects first.
        """
        return ActorLister(self.address)

    def cluster_file(self, folder: Path, **ray: object) -> Path:
        """A cluster file of ``executor: ray`` on this cluster (``ray:`` keys added)."""
        import yaml

        path = folder / "ray-cluster.yaml"
        path.write_text(
            yaml.safe_dump({"executor": "ray", "ray": {"address": self.address, **ray}})
        )
        return path


# Another Ray user's job: connects with its own Ray Client session, starts one idle
# actor per name with the resources it is given, says "held" once all are placed, and
# kills the actor of each name read from stdin ("released"), then the rest at EOF.
_OTHER_JOB = """
import json, sys, time, ray
for attempt in range(3):  # Ray Client's server now and then fails a new connection
    try:
        ray.init(namespace="another-ray-user", logging_level="ERROR")
        break
    except Exception:
        if attempt == 2:
            raise
        time.sleep(2)

@ray.remote
class Holder:
    def ready(self):
        return True

holders = {name: Holder.options(**options).remote() for name, options in json.loads(sys.argv[1]).items()}
ray.get([holder.ready.remote() for holder in holders.values()], timeout=120)
print("held", flush=True)
for line in sys.stdin:
    ray.kill(holders.pop(line.strip()))
    print("released", flush=True)
for holder in holders.values():
    ray.kill(holder)
"""


# Lists slotsweep's named actors each time a line arrives on stdin, after connecting
# once (Ray Client's server now and then fails a new connection under load, its proxier
# reading a zombie's command line: tried three times, as the executor itself does).
_ACTOR_LISTER = """
import sys, time, ray
for attempt in range(3):
    try:
        ray.init(namespace="slotsweep", logging_level="ERROR")
        break
    except Exception:
        if attempt == 2:
            raise
        time.sleep(2)
print("connected", flush=True)
for _ in sys.stdin:
    names = [n for n in ray.util.list_named_actors() if n.startswith("slotsweep-")]
    print(" ".join(names), flush=True)
"""


class ActorLister:
    """A connected Ray client (a process of its own) that lists slotsweep's live actors.

    Started by :meth:`RayCluster.actor_lister`; each call answers from the cluster at
    that moment; :meth:`close` (or leaving the ``with`` block) ends it.
    """

    def __init__(self, address: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ACTOR_LISTER],
            env={**cli_environment(), "RAY_ADDRESS": address},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._read("connecting")

    def _read(self, doing: str) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            _, err = self._finish()
            raise RayClusterError(f"the actor lister failed {doing}: {err[-2000:]}")
        return line.strip()

    def __call__(self) -> list[str]:
        """The names of slotsweep's actors alive now."""
        assert self._process.stdin is not None
        self._process.stdin.write("list\n")
        self._process.stdin.flush()
        return self._read("listing").split()

    def _finish(self) -> tuple[str, str]:
        try:
            return self._process.communicate(input="", timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.communicate()

    def close(self) -> None:
        """End the lister's client."""
        self._finish()

    def __enter__(self) -> ActorLister:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class OtherRayJob:
    """Another Ray job on the cluster holding resources (``ray.remote`` options per name).

    Started by :meth:`RayCluster.other_job`; :meth:`release` gives one name's resources
    back, :meth:`close` (or leaving the ``with`` block) all.
    """

    def __init__(self, address: str, holders: dict[str, dict[str, object]]) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _OTHER_JOB, json.dumps(holders)],
            env={**os.environ, "RAY_ADDRESS": address},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._expect("held")

    def _expect(self, word: str) -> None:
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if line != word:
            self.close()
            raise RayClusterError(f"the other Ray job did not say {word!r}: {line!r}")

    def release(self, name: str) -> None:
        """Kill the actor ``name``: its resources are free again when this returns."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{name}\n")
        self._process.stdin.flush()
        self._expect("released")

    def close(self) -> None:
        """Kill every actor left and end the job's process."""
        try:
            _, err = self._process.communicate(input="", timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, err = self._process.communicate()
        if self._process.returncode != 0:
            raise RayClusterError(f"the other Ray job failed: {err[-2000:]}")

    def __enter__(self) -> OtherRayJob:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A three-node Ray cluster for the whole session; every node stopped by session id."""
    if os.geteuid() != 0:
        cannot_run_here("a Ray cluster on network namespaces needs root")
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        cannot_run_here("ray is not installed (pip install 'slotsweep[ray]')")
    cluster = RayCluster()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    stop = released_after_group("ray", cluster.stop)
    try:
        yield cluster
    finally:
        stop()


@pytest.fixture(scope="session")
def ray_postgres(ray_cluster: RayCluster) -> Iterator[PostgresServer]:
    """A PostgreSQL server on the bridge address, which the ranks on the nodes reach."""
    prefix = ray_cluster.subnet.split("/")[1]
    server = PostgresServer(listen_address=f"{ray_cluster.controller_address}/{prefix}")
    server.start()
    remove = released_after_group("ray", server.remove)
    try:
        yield server
    finally:
        remove()


@pytest.fixture
def ray_database(ray_postgres: PostgresServer) -> Iterator[str]:
    """A fresh database of the test's own on the nodes' PostgreSQL server (its URL)."""
    yield from fresh_database(ray_postgres.url)
