"""The Ray executor: trials on a Ray cluster's nodes, placed by slotsweep's scheduler.

With ``executor: ray`` in the cluster file the agents are the Ray cluster's alive nodes,
each with its GPUs as slots (CPU slots on nodes without GPUs; ``ray.slot_type``
chooses); nodes without slots (a head started with ``--num-cpus=0``) are no agents.
Ray does what it is good at, knowing the nodes, reserving resources on them and
starting processes there; slotsweep keeps ``torchrun``, its scheduler's rules, its
queue and its database.

An attempt placed on k nodes is one placement group of k bundles, each pinned to its
node (Ray's ``node:<address>`` resource) and holding exactly the placement's slots
there, and one :class:`~trials.node.ray_actors.NodeRunner` actor per bundle, which
starts that node's ``torchrun`` with c10d rendezvous on the first node. Ray reserves
the group when it can; a group still unreserved after ``ray.reserve_timeout_s`` (a node
left between the scheduler's decision and the reservation) is removed and the trial
goes back to the queue with that reason, never left pending. Each node's output is
collected at every poll and appended to the trial's log. A node that dies fails the
attempt (its actor's calls raise at once), which restarts from its latest checkpoint;
the dead node is no agent any more until it rejoins.

Everything of an attempt is named after its launch token (``slotsweep-TOKEN``, the
actors ``slotsweep-TOKEN-I``) in Ray namespace ``slotsweep``: a driver that starts after
a crash finds a dead driver's actors by name and ends them. They are no detached
actors either: Ray ends them itself once the dead driver's Ray Client session times out
(30 s), so nothing is left on a cluster that nobody resumes.

The driver connects once per process (``ray.init``), through Ray Client
(``ray://HEAD:10001``) when it runs outside the cluster; ``ray`` is the optional extra
``slotsweep[ray]``, imported only here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
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
from trials.node.ray_actors import ClusterProbe, NodeRunner
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
#: An attempt's placement group is ``slotsweep-TOKEN``; its actors add ``-I``.
GROUP_PREFIX = "slotsweep-"
# A node's pin: a sliver of Ray's per-node resource, so the bundle lands on that node.
_PIN = 0.001
_CALL_TIMEOUT_S = 30.0
# Ray Client's server starts a process per driver; on a loaded head that start fails
# now and then ("Starting Ray client server failed"), and a second try succeeds.
_CONNECT_TRIES = 3
_CONNECT_RETRY_S = 2.0
# How long recording a launch waits for the actors' torchrun to start, to record its
# pids (Ray starts an actor's worker in a second or two); a later start is still noted
# in the run's agents when the driver sees it.
_START_WAIT_S = 10.0
_GONE_WAIT_S = 15.0
_USAGE_TTL_S = 2.0


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
class RayJob:
    """One attempt: its placement group, one actor per node, and their output so far."""

    name: str
    group: Any
    actors: list[Any]
    starts: list[Any]
    agents: list[dict[str, Any]]
    log_path: Path
    reserve_timeout_s: float
    launched_at: float = field(default_factory=time.monotonic)
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

    def _check_started(self) -> bool:
        """Whether every node's ``torchrun`` runs; gives the reservation up past its time."""
        ray = _ray()
        ready, _ = ray.wait(self.starts, num_returns=len(self.starts), timeout=0)
        if len(ready) < len(self.starts):
            if time.monotonic() - self.launched_at < self.reserve_timeout_s:
                return False
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
        elif len(self._codes) == len(self.actors):
            self._exit = 0
        if self._exit is not None:
            self._release()
        return self._exit

    def _collect(self) -> None:
        """Append every node's new output to the log; note the nodes whose torchrun ended."""
        ray = _ray()
        refs = {
            i: actor.drain.remote() for i, actor in enumerate(self.actors) if i not in self._codes
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
        """End every node's ``torchrun``; whether each is confirmed gone (or its actor dead)."""
        ray = _ray()
        refs = [actor.terminate.remote(grace_s) for actor in self.actors]
        gone = True
        for ref in refs:
            try:
                gone = bool(ray.get(ref, timeout=grace_s + _GONE_WAIT_S)) and gone
            except ray.exceptions.GetTimeoutError:
                gone = False
            except Exception:
                pass  # the actor is dead, and its torchrun with it (PR_SET_PDEATHSIG)
        return gone

    def _release(self) -> None:
        """Give the attempt's actors and reserved slots back to Ray."""
        _end_actors(self.actors, self.group)

    def end(self, *, grace_s: float) -> bool:
        if self._exit is not None:
            return True
        gone = self._terminate(grace_s=grace_s)
        if self._started:
            self._collect()
        self._release()
        # Ended from here: what each node's torchrun returned, else what SIGTERM gives.
        failed = [code for code in self._codes.values() if code != 0]
        ended_all = len(self._codes) == len(self.actors)
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


def _end_actors(actors: Sequence[Any], group: Any | None) -> None:
    """Kill ``actors`` (their ``torchrun`` dies with them) and remove ``group``."""
    ray = _ray()
    for actor in actors:
        with contextlib.suppress(Exception):  # already dead
            ray.kill(actor, no_restart=True)
    if group is not None:
        with contextlib.suppress(Exception):  # already removed
            ray.util.remove_placement_group(group)


def _named_actors(token: str) -> list[str]:
    """The names of the live actors of the attempt with launch token ``token`` (any driver's)."""
    prefix = f"{group_name(token)}-"
    return [
        name
        for name in _ray().util.list_named_actors()
        if isinstance(name, str) and name.startswith(prefix)
    ]


class RayExecutor:
    """Starts each attempt as a placement group and one actor per node of a Ray cluster.

    With the test cluster of ``.ci/ray.sh`` (no example runs it here)::

        cluster = load_cluster("ray-cluster.yaml")   # executor: ray
        job = RayExecutor(cluster).launch(request)
    """

    name = "ray"
    remote = True
    places_trials = False

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self.settings = (cluster.ray if cluster is not None else None) or RaySettings()
        self._probe: Any = None
        self._runner_class: Any = None
        self._usage: tuple[float, dict[str, tuple[bool, float]]] | None = None

    def _connect(self) -> Any:
        return connect(self.settings.address)

    def launch(self, request: LaunchRequest) -> RayJob:
        placement = request.placement
        if self.cluster is None or placement is None:
            raise RuntimeError("the Ray executor launches placed trials of a Ray cluster")
        ray = self._connect()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

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
        # A node's actors start with the node's environment, not the driver's: the
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
        if self._runner_class is None:
            # Wrapped once: each wrapping is a new class that Ray Client sends to the cluster.
            self._runner_class = ray.remote(NodeRunner)
        actor_class = self._runner_class
        actors, starts = [], []
        for index, part in enumerate(parts):
            actor = actor_class.options(
                name=f"{name}-{index}",
                namespace=RAY_NAMESPACE,
                num_cpus=0 if use_gpus else len(part.slots),
                num_gpus=len(part.slots) if use_gpus else 0,
                # drain and terminate are answered while torchrun runs.
                max_concurrency=4,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
            ).remote()
            argv = torchrun_args(
                nnodes=len(parts),
                nproc_per_node=len(part.slots),
                rdzv_endpoint=endpoint,
                rdzv_id=request.rdzv_id,
            )
            starts.append(
                actor.start.remote(
                    list(argv),
                    env=env,
                    cwd=str(request.cwd),
                    agent=part.agent.name,
                    slots=list(part.slots),
                    gpu_slots=use_gpus,
                )
            )
            actors.append(actor)
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        agents = [
            {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
            for part in parts
        ]
        return RayJob(
            name=name,
            group=group,
            actors=actors,
            starts=starts,
            agents=agents,
            log_path=request.log_path,
            reserve_timeout_s=self.settings.reserve_timeout_s,
        )

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        if not run.launch_token:
            return True
        try:
            gone = self._end_named(run.launch_token, grace_s=grace_s)
        except Exception:  # Ray does not answer (RayError, a timeout): nothing confirmed
            return False
        if gone:
            mark_processes_ended(session, run)
        return gone

    def _end_named(self, token: str, *, grace_s: float) -> bool:
        """End the actors and placement group of attempt ``token``; whether none is left."""
        ray = self._connect()
        if not _named_actors(token):
            return True
        left = ray.get(
            self._probe_actor().end_attempt.remote(
                f"{group_name(token)}-", RAY_NAMESPACE, grace_s
            ),
            timeout=grace_s + 2 * _GONE_WAIT_S + _CALL_TIMEOUT_S,
        )
        return not left

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        if run.ended_at is not None or not run.launch_token:
            return True
        try:
            self._connect()
            gone = not _named_actors(run.launch_token)
        except RayError:
            return False
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
            alive, foreign = usage.get(hosts.get(name, ""), (False, 0.0))
            # A node some other Ray user holds slots of is left whole to it: the ledger
            # knows slotsweep's own slots only.
            if not alive or foreign > 0:
                lost.add(name)
        return frozenset(lost)

    def _probe_actor(self) -> Any:
        """This driver's :class:`ClusterProbe` (no CPU, on the head node), started once."""
        if self._probe is None:
            self._probe = (
                self._connect()
                .remote(ClusterProbe)
                .options(num_cpus=0, resources={"node:__internal_head__": _PIN})
                .remote()
            )
        return self._probe

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
            self._probe = None
            return None
        self._usage = (now, usage)
        return usage
