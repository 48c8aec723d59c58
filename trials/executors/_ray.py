"""The Ray executor: trials on a Ray cluster's nodes, placed by slotsweep's scheduler.

With ``executor: ray`` in the cluster file the agents are the Ray cluster's alive nodes,
each with its GPUs as slots (CPU slots on nodes without GPUs; ``ray.slot_type``
chooses); nodes without slots (a head started with ``--num-cpus=0``) are no agents.
Ray does what it is good at, knowing the nodes, reserving resources on them and
starting processes there; slotsweep keeps ``torchrun``, its scheduler's rules, its
queue and its database.

An attempt placed on k nodes is one placement group of k bundles, each pinned to its
node (Ray's ``node:<address>`` resource) and holding exactly the placement's slots
there. Once Ray has reserved the group, the driver's
:class:`~trials.node.ray_actors.NodeRunner` of each of those nodes (one per node for the
driver's whole run, holding no slot itself, started at the first attempt there) starts
that node's ``torchrun`` with c10d rendezvous on the first node; with GPU slots a task
in each bundle first reads which GPUs Ray reserved there. A group still unreserved after
``ray.reserve_timeout_s`` (a node left between the scheduler's decision and the
reservation) is removed and the trial goes back to the queue with that reason, never
left pending. Each node's output is collected at every poll and appended to the
trial's log. A node that dies fails the attempt (its runner's calls raise at once),
which restarts from its latest checkpoint; the dead node is no agent any more until it
rejoins, and gets a new runner then.

An attempt's placement group is named after its launch token (``slotsweep-TOKEN``) and
each runner after its driver (``slotsweep-node-DRIVER-N``), in Ray namespace
``slotsweep``: a driver that starts after a crash asks every runner whether it runs a
dead driver's attempt, ends it there and ends runners left with nothing to run. They
are no detached actors either: Ray ends them itself once the dead driver's Ray Client
session times out (30 s), so nothing is left on a cluster that nobody resumes.

The driver connects once per process (``ray.init``), through Ray Client
(``ray://HEAD:10001``) when it runs outside the cluster; ``ray`` is the optional extra
``slotsweep[ray]``, imported only here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.checkpoint_storage import storage_environment
from trials.executors._base import JobEnding
from trials.executors._process_rows import add_torchrun_row, mark_processes_ended
from trials.executors._slurm_commands import rendezvous_port
from trials.launch.launcher import SPEC_ENV_VAR, torchrun_args
from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR
from trials.node.cluster_node import IFNAME_ENV_VAR, RDZV_HOST_ENV_VAR, RDZV_NODE_ENV_VAR
from trials.node.ray_actors import ClusterProbe, NodeRunner, bundle_gpus
from trials.scheduler import (
    DEFAULT_POOL,
    Agent,
    Cluster,
    ClusterConfigError,
    RayNodes,
    RaySettings,
    ResourcePool,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import TrialRun
    from trials.executors._base import LaunchRequest

#: The Ray namespace of every actor and placement group slotsweep creates.
RAY_NAMESPACE = "slotsweep"
#: An attempt's placement group is ``slotsweep-TOKEN``.
GROUP_PREFIX = "slotsweep-"
#: A driver's node runners are ``slotsweep-node-DRIVER-N``.
RUNNER_PREFIX = "slotsweep-node-"
# Calls a runner answers at once: each node's start, drain and terminate of every
# attempt its driver runs there (a terminate waits up to the kill grace).
_RUNNER_CONCURRENCY = 64
# A node's pin: a sliver of Ray's per-node resource, so the bundle lands on that node.
_PIN = 0.001
_CALL_TIMEOUT_S = 30.0
# Ray Client's server starts a process per driver; on a loaded head that start fails
# now and then ("Starting Ray client server failed"), and a second try succeeds.
_CONNECT_TRIES = 3
_CONNECT_RETRY_S = 2.0
# How long recording a launch waits for the nodes' torchrun to start, to record its
# pids (a node's first runner takes Ray a second or two to start); a later start is
# still noted in the run's agents when the driver sees it.
_START_WAIT_S = 10.0
_GONE_WAIT_S = 15.0
_USAGE_TTL_S = 2.0


@dataclass
class _DriverState:
    """What every Ray executor of this process (one driver) shares.

    ``executor_named("ray")`` builds a new executor to end a recorded run, so what a
    run's end needs is kept here, not on an executor.
    """

    #: Names this driver's runners (``slotsweep-node-ID-N``).
    driver_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: This driver's attempts that every runner has forgotten: nothing runs them.
    released: set[str] = field(default_factory=set)
    #: This driver's :class:`ClusterProbe`, started at its first use.
    probe: Any = None
    #: How many runners this driver has started (each runner's name is new).
    runners_started: int = 0


_DRIVER = _DriverState()


class RayError(RuntimeError):
    """Ray is not installed, or its cluster cannot be reached; the message says which."""


def _ray() -> Any:
    """The ``ray`` module (the optional extra ``slotsweep[ray]``)."""
    try:
        import ray
    except ImportError:
        raise RayError(
            "executor ray: the ray package is not installed; pip install 'slotsweep[ray]'"
        ) from None
    return ray


def connect(address: str | None) -> Any:
    """Connect this process to the Ray cluster at ``address`` (else ``$RAY_ADDRESS``); ``ray``.

    Once per process: later calls reuse the connection.
    """
    ray = _ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise RayError(
            "executor ray: no Ray cluster named; set ray.address in the cluster file "
            "(ray://HEAD:10001) or RAY_ADDRESS"
        )
    last: Exception | None = None
    for attempt in range(_CONNECT_TRIES):
        if attempt:
            time.sleep(_CONNECT_RETRY_S)
        try:
            ray.init(
                address=address,
                namespace=RAY_NAMESPACE,
                logging_level="ERROR",
                log_to_driver=False,
            )
            return ray
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, gRPC errors...
            last = exc
            with contextlib.suppress(Exception):
                ray.shutdown()
    raise RayError(f"executor ray: cannot connect to {address}: {last}")


def group_name(token: str) -> str:
    """The placement group of the attempt with launch token ``token``."""
    return f"{GROUP_PREFIX}{token}"


def _slot_resource(use_gpus: bool) -> str:
    return "GPU" if use_gpus else "CPU"


def node_agents(
    nodes: Sequence[dict[str, Any]], slot_type: str | None
) -> tuple[list[Agent], bool]:
    """The agents of Ray's node list (``ray.nodes()``) and whether their slots are GPUs.

    Alive nodes only (a dead node stays listed); GPUs when any node has one unless
    ``slot_type`` is ``cpu``; a node with no slot of that kind is no agent. An agent is
    named after its node's host name, its host is the node's Ray address.

    Example:
        >>> nodes = [{"Alive": True, "NodeManagerHostname": "n1",
        ...           "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 2.0}},
        ...          {"Alive": True, "NodeManagerHostname": "head",
        ...           "NodeManagerAddress": "10.0.0.1", "Resources": {}}]
        >>> [(a.name, a.host, a.slots) for a in node_agents(nodes, None)[0]]
        [('n1', '10.0.0.2', (0, 1))]
    """
    alive = sorted(
        (node for node in nodes if node.get("Alive")),
        key=lambda node: (node["NodeManagerHostname"], node["NodeManagerAddress"]),
    )
    has_gpus = any(node["Resources"].get("GPU", 0) >= 1 for node in alive)
    use_gpus = slot_type == "gpu" or (slot_type is None and has_gpus)
    resource = _slot_resource(use_gpus)
    names = [node["NodeManagerHostname"] for node in alive]
    agents = []
    for node in alive:
        count = int(node["Resources"].get(resource, 0))
        if count < 1:
            continue
        name = node["NodeManagerHostname"]
        if names.count(name) > 1:  # several Ray nodes on one host: its address tells them apart
            name = f"{name}@{node['NodeManagerAddress']}"
        agents.append(Agent(name=name, host=node["NodeManagerAddress"], slots=tuple(range(count))))
    return agents, use_gpus


def ray_cluster(nodes: RayNodes) -> Cluster:
    """The Ray cluster of a cluster file's ``executor: ray``: one agent per alive node with slots."""
    try:
        ray = connect(nodes.settings.address)
        found = ray.nodes()
    except RayError as exc:
        raise ClusterConfigError([str(exc)]) from None
    agents, use_gpus = node_agents(found, nodes.settings.slot_type)
    if not agents:
        kind = "GPU" if use_gpus else "CPU"
        raise ClusterConfigError(
            [f"executor ray: no alive Ray node has a {kind} to use as a trial slot"]
        )
    return Cluster(
        pools=(ResourcePool(name=DEFAULT_POOL, agents=tuple(agents)),),
        executor="ray",
        dtrain_network_interface=nodes.dtrain_network_interface,
        gpu_slots=use_gpus,
        ray=nodes.settings,
    )


@dataclass
class NodeStart:
    """What one node's runner needs to start its part of an attempt."""

    argv: list[str]
    agent: str
    slots: list[int]


@dataclass
class RayJob:
    """One attempt: its placement group, the runners of its nodes, and their output so far."""

    name: str
    token: str
    group: Any
    runners: list[Any]
    nodes: list[NodeStart]
    env: dict[str, str]
    cwd: str
    use_gpus: bool
    agents: list[dict[str, Any]]
    log_path: Path
    reserve_timeout_s: float
    #: Told the index of a node whose runner died, so that the next attempt there gets a new one.
    runner_lost: Callable[[int], None]
    #: Told once every runner has forgotten the attempt (its torchrun is gone).
    released: Callable[[str], None]
    launched_at: float = field(default_factory=time.monotonic)
    starts: list[Any] | None = None
    _started: bool = False
    _exit: int | None = None
    _codes: dict[int, int] = field(default_factory=dict)
    _ending: JobEnding = field(default_factory=JobEnding)

    @property
    def external_id(self) -> str | None:
        return self.name

    def _log(self, lines: Sequence[str]) -> None:
        if lines:
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write("".join(f"{line}\n" for line in lines))

    def _node_lost(self, index: int, exc: BaseException) -> None:
        agent = self.agents[index]["agent"]
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self._log([f"[slotsweep] Ray node {agent} lost its actor: {first}"])
        self._codes.setdefault(index, 1)
        if isinstance(exc, _ray().exceptions.RayActorError):
            self.runner_lost(index)

    def _start_nodes(self) -> list[Any]:
        """Ask each node's runner to start its ``torchrun`` (the group is reserved)."""
        ray = _ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        starts = []
        for index, (runner, node) in enumerate(zip(self.runners, self.nodes, strict=True)):
            gpus = None
            if self.use_gpus:
                # The bundle's GPUs, as Ray gives them to a task holding them all; the
                # runner's call waits for the answer inside the cluster.
                gpus = (
                    ray.remote(bundle_gpus)
                    .options(
                        num_cpus=0,
                        num_gpus=len(node.slots),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=self.group, placement_group_bundle_index=index
                        ),
                    )
                    .remote()
                )
            starts.append(
                runner.start.remote(
                    self.token,
                    node.argv,
                    env=self.env,
                    cwd=self.cwd,
                    agent=node.agent,
                    slots=node.slots,
                    gpus=gpus,
                )
            )
        return starts

    def _give_up(self) -> None:
        """Past ``reserve_timeout_s``: release the group and end with the reason."""
        state = _group_state(self.group)
        nodes = ", ".join(agent["agent"] for agent in self.agents)
        what = (
            "did not reserve its slots on " + nodes + f" (placement group {state})"
            if state != "CREATED"
            else "reserved its slots on " + nodes + " but did not start its actors"
        )
        self._ending = JobEnding(
            stopped_by_cluster=f"Ray {what} within {self.reserve_timeout_s:g} s"
        )
        self._release()
        self._exit = 1

    def _check_started(self) -> bool:
        """Whether every node's ``torchrun`` runs; gives the reservation up past its time."""
        ray = _ray()
        timed_out = time.monotonic() - self.launched_at >= self.reserve_timeout_s
        if self.starts is None:
            if not _group_ready(self.group):
                if timed_out:
                    self._give_up()
                return False
            self.starts = self._start_nodes()
        ready, _ = ray.wait(self.starts, num_returns=len(self.starts), timeout=0)
        if len(ready) < len(self.starts):
            if timed_out:
                self._give_up()
            return False
        for index, ref in enumerate(self.starts):
            try:
                info = ray.get(ref, timeout=_CALL_TIMEOUT_S)
            except Exception as exc:  # the node died before its torchrun started
                self._node_lost(index, exc)
                continue
            self.agents[index].update(info)
        self._started = True
        return True

    def poll(self) -> int | None:
        if self._exit is not None:
            return self._exit
        if not self._started and not self._check_started():
            return self._exit
        self._collect()
        failed = [code for code in self._codes.values() if code != 0]
        if failed:
            # The other nodes' torchrun would wait 300 s in its exit barrier.
            self._terminate(grace_s=0.0)
            self._exit = failed[0]
        elif len(self._codes) == len(self.runners):
            self._exit = 0
        if self._exit is not None:
            self._release()
        return self._exit

    def _collect(self) -> None:
        """Append every node's new output to the log; note the nodes whose torchrun ended."""
        ray = _ray()
        refs = {
            i: runner.drain.remote(self.token)
            for i, runner in enumerate(self.runners)
            if i not in self._codes
        }
        for index, ref in refs.items():
            try:
                lines, code = ray.get(ref, timeout=_CALL_TIMEOUT_S)
            except Exception as exc:
                self._node_lost(index, exc)
                continue
            self._log(lines)
            if code is not None:
                self._codes[index] = code

    def _terminate(self, *, grace_s: float) -> bool:
        """End every node's ``torchrun``; whether each is confirmed gone (or its runner dead)."""
        ray = _ray()
        refs = [runner.terminate.remote(self.token, grace_s) for runner in self.runners]
        gone = True
        for ref in refs:
            try:
                gone = bool(ray.get(ref, timeout=grace_s + _GONE_WAIT_S)) and gone
            except ray.exceptions.GetTimeoutError:
                gone = False
            except Exception:
                pass  # the runner is dead, and its torchrun with it (PR_SET_PDEATHSIG)
        return gone

    def _release(self) -> None:
        """Give the attempt's reserved slots back to Ray; the runners forget the attempt.

        A runner whose start call is still on its way refuses it (the calls of a
        threaded actor may overtake each other); one that started it ends it.
        """
        ray = _ray()
        if self.starts is None:
            # Never reserved: no runner was asked to start anything.
            with contextlib.suppress(Exception):  # already removed
                ray.util.remove_placement_group(self.group)
            self.released(self.token)
            return
        refs = []
        for runner in self.runners:
            with contextlib.suppress(Exception):  # a dead runner took its torchrun with it
                refs.append(runner.release.remote(self.token))
        with contextlib.suppress(Exception):  # already removed
            ray.util.remove_placement_group(self.group)
        try:
            # Waited for, as ending an actor was: the attempt's end is confirmed at once.
            ray.get(refs, timeout=_CALL_TIMEOUT_S + _GONE_WAIT_S)
        except ray.exceptions.RayActorError:
            self.released(self.token)  # a dead runner took its torchrun with it
        except Exception:
            return  # not confirmed: asked again through the cluster's probe
        else:
            self.released(self.token)

    def end(self, *, grace_s: float) -> bool:
        if self._exit is not None:
            return True
        gone = self._terminate(grace_s=grace_s)
        if self._started:
            self._collect()
        self._release()
        # Ended from here: what each node's torchrun returned, else what SIGTERM gives.
        failed = [code for code in self._codes.values() if code != 0]
        ended_all = len(self._codes) == len(self.runners)
        self._exit = failed[0] if failed else (0 if ended_all else -signal.SIGTERM)
        return gone

    def record(self, session: Session, run: TrialRun) -> None:
        deadline = time.monotonic() + _START_WAIT_S
        while not self._started and self._exit is None and time.monotonic() < deadline:
            if not self._check_started():
                time.sleep(0.1)
        run.agents = self.describe()
        run.external_id = self.name
        for agent in run.agents:
            if agent.get("create_time") is not None:
                add_torchrun_row(
                    session,
                    run,
                    agent=agent["agent"],
                    host=agent["host"],
                    slots=agent["slots"],
                    pid=agent["pid"],
                    create_time=agent["create_time"],
                )

    def waiting_reason(self) -> str | None:
        if self._started or self._exit is not None:
            return None
        nodes = ", ".join(agent["agent"] for agent in self.agents)
        return f"waiting for Ray to reserve its slots on {nodes} (placement group {self.name})"

    def ending(self) -> JobEnding:
        return self._ending

    def describe(self) -> list[dict[str, Any]]:
        return [dict(agent) for agent in self.agents]


def _group_state(group: Any) -> str:
    try:
        return str(_ray().util.placement_group_table(group).get("state", "UNKNOWN"))
    except Exception:
        return "UNKNOWN"


def _group_ready(group: Any) -> bool:
    """Whether Ray has reserved ``group`` (asked without waiting)."""
    try:
        return bool(group.wait(timeout_seconds=0))
    except Exception:  # removed, or Ray does not answer: not reserved
        return False


class RayExecutor:
    """Starts each attempt as a placement group and one actor per node of a Ray cluster.

    With the test cluster of ``.ci/ray.sh`` (no example runs it here)::

        cluster = load_cluster("ray-cluster.yaml")   # executor: ray
        job = RayExecutor(cluster).launch(request)
    """

    name = "ray"
    remote = True
    places_trials = False
    # A bundle's GPUs are Ray's to pick; a fractional bundle would not follow the ledger.
    shares_slots = False

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self.settings = (cluster.ray if cluster is not None else None) or RaySettings()
        self._runner_class: Any = None
        # This driver's runner on each node (by the node's address), started at its
        # first attempt there; each runner's name is new (a lost one's may linger).
        self._runners: dict[str, Any] = {}
        self._usage: tuple[float, dict[str, tuple[bool, float]]] | None = None

    def _connect(self) -> Any:
        return connect(self.settings.address)

    def launch(self, request: LaunchRequest) -> RayJob:
        placement = request.placement
        if self.cluster is None or placement is None:
            raise RuntimeError("the Ray executor launches placed trials of a Ray cluster")
        ray = self._connect()

        use_gpus = bool(self.cluster.gpu_slots)
        resource = _slot_resource(use_gpus)
        parts = placement.agents
        bundles = [
            {resource: float(len(part.slots)), f"node:{part.agent.host}": _PIN} for part in parts
        ]
        name = group_name(request.token)
        group = ray.util.placement_group(bundles, strategy="STRICT_SPREAD", name=name)
        first = parts[0].agent
        endpoint = f"{first.host}:{rendezvous_port(request.rdzv_id)}" if len(parts) > 1 else None
        # A node's runner starts with the node's environment, not the driver's: the
        # driver's object-store credentials go with the attempt, as srun's --export=ALL
        # takes them on Slurm.
        env = {
            **storage_environment(os.environ),
            **request.env,
            SPEC_ENV_VAR: request.spec_json,
            LAUNCH_TOKEN_ENV_VAR: request.token,
        }
        if len(parts) > 1:
            env[RDZV_HOST_ENV_VAR] = first.host
            env[RDZV_NODE_ENV_VAR] = first.name
        if self.cluster.dtrain_network_interface:
            env[IFNAME_ENV_VAR] = self.cluster.dtrain_network_interface
        nodes = [
            NodeStart(
                argv=list(
                    torchrun_args(
                        nnodes=len(parts),
                        nproc_per_node=len(part.slots),
                        rdzv_endpoint=endpoint,
                        rdzv_id=request.rdzv_id,
                    )
                ),
                agent=part.agent.name,
                slots=list(part.slots),
            )
            for part in parts
        ]
        runners = [self._runner(part.agent.host) for part in parts]
        hosts = [part.agent.host for part in parts]

        def released(token: str) -> None:
            _DRIVER.released.add(token)

        def runner_lost(index: int) -> None:
            if self._runners.get(hosts[index]) is runners[index]:
                del self._runners[hosts[index]]

        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        agents = [
            {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
            for part in parts
        ]
        return RayJob(
            name=name,
            token=request.token,
            group=group,
            runners=runners,
            nodes=nodes,
            env=env,
            cwd=str(request.cwd),
            use_gpus=use_gpus,
            agents=agents,
            log_path=request.log_path,
            reserve_timeout_s=self.settings.reserve_timeout_s,
            runner_lost=runner_lost,
            released=released,
        )

    def _runner(self, host: str) -> Any:
        """This driver's :class:`NodeRunner` on the node at ``host``, started at its first use."""
        runner = self._runners.get(host)
        if runner is None:
            if self._runner_class is None:
                # Wrapped once: each wrapping is a new class that Ray Client sends again.
                self._runner_class = self._connect().remote(NodeRunner)
                # Ray would end them with this driver's Ray job, after Ray Client's
                # reconnection grace (30 s) where the driver leaves without a goodbye.
                atexit.register(self._end_runners)
            _DRIVER.runners_started += 1
            runner = self._runner_class.options(
                name=f"{RUNNER_PREFIX}{_DRIVER.driver_id}-{_DRIVER.runners_started}",
                namespace=RAY_NAMESPACE,
                # No slot of its own: each attempt's placement group holds those.
                num_cpus=0,
                resources={f"node:{host}": _PIN},
                max_concurrency=_RUNNER_CONCURRENCY,
                max_restarts=0,
            ).remote()
            self._runners[host] = runner
        return runner

    def _end_runners(self) -> None:
        """End this driver's runners (and whatever ``torchrun`` they still run)."""
        for runner in list(self._runners.values()):
            with contextlib.suppress(Exception):  # dead, or Ray is gone already
                _ray().kill(runner, no_restart=True)
        self._runners.clear()

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        if not run.launch_token:
            return True
        if run.launch_token in _DRIVER.released:
            mark_processes_ended(session, run)
            return True
        try:
            gone = self._end_named(run.launch_token, grace_s=grace_s)
        except Exception:  # Ray does not answer (RayError, a timeout): nothing confirmed
            return False
        if gone:
            mark_processes_ended(session, run)
        return gone

    def _end_named(self, token: str, *, grace_s: float) -> bool:
        """End attempt ``token`` on every runner and remove its group; whether none runs it."""
        ray = self._connect()
        left = ray.get(
            self._probe_actor().end_attempt.remote(
                token,
                group_name(token),
                RUNNER_PREFIX,
                RAY_NAMESPACE,
                grace_s,
                keep=f"{RUNNER_PREFIX}{_DRIVER.driver_id}-",
            ),
            timeout=grace_s + 2 * _GONE_WAIT_S + 2 * _CALL_TIMEOUT_S,
        )
        return not left

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        if run.ended_at is not None or not run.launch_token:
            return True
        if run.launch_token in _DRIVER.released:
            mark_processes_ended(session, run)
            return True
        try:
            ray = self._connect()
            holders = ray.get(
                self._probe_actor().holders.remote(run.launch_token, RUNNER_PREFIX, RAY_NAMESPACE),
                timeout=2 * _CALL_TIMEOUT_S,
            )
        except Exception:  # Ray does not answer (RayError, a timeout): nothing confirmed
            return False
        gone = not holders
        if gone:
            mark_processes_ended(session, run)
        return gone

    def unavailable_agents(self, names: Sequence[str]) -> frozenset[str]:
        if not names or self.cluster is None:
            return frozenset()
        usage = self._node_usage()
        if usage is None:
            # Ray does not answer: no node can be judged, none is excluded (the
            # reservation's own timeout says more than a guess would).
            return frozenset()
        hosts = {agent.name: agent.host for _, agent in self.cluster.agents}
        lost = set()
        for name in names:
            host = hosts.get(name, "")
            alive, foreign = usage.get(host, (False, 0.0))
            if not alive:
                # Its runner died with it; a node that rejoins gets a new one.
                self._runners.pop(host, None)
            # A node some other Ray user holds slots of is left whole to it: the ledger
            # knows slotsweep's own slots only.
            if not alive or foreign > 0:
                lost.add(name)
        return frozenset(lost)

    def _probe_actor(self) -> Any:
        """This driver's :class:`ClusterProbe` (no CPU, on the head node), started once."""
        if _DRIVER.probe is None:
            _DRIVER.probe = (
                self._connect()
                .remote(ClusterProbe)
                .options(num_cpus=0, resources={"node:__internal_head__": _PIN})
                .remote()
            )
        return _DRIVER.probe

    def _node_usage(self) -> dict[str, tuple[bool, float]] | None:
        """Each node's (alive, slots others use), asked at most every few seconds."""
        now = time.monotonic()
        if self._usage is not None and now - self._usage[0] < _USAGE_TTL_S:
            return self._usage[1]
        try:
            ray = self._connect()
            resource = _slot_resource(bool(self.cluster is not None and self.cluster.gpu_slots))
            usage: dict[str, tuple[bool, float]] = ray.get(
                self._probe_actor().node_usage.remote(GROUP_PREFIX, resource),
                timeout=_CALL_TIMEOUT_S,
            )
        except Exception:
            _DRIVER.probe = None
            return None
        self._usage = (now, usage)
        return usage
