"""The cluster model: resource pools of agents, each agent with a fixed set of slots.

These are plain frozen dataclasses (no I/O) so the scheduler core can be a pure function
of them; :mod:`trials.scheduler._cluster_file` builds them from a cluster file or the
local machine.

Example:
    >>> agent = Agent(name="a1", host="127.0.0.1", slots=(0, 1))
    >>> cluster = Cluster(pools=(ResourcePool(name="default", agents=(agent,)),))
    >>> cluster.pool("default").agents[0].size
    2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trials.config import NotificationConfig

FittingPolicy = Literal["best", "worst"]


@dataclass(frozen=True)
class Agent:
    """One machine: ``slots`` are its GPU indices, or CPU slot numbers without GPUs."""

    name: str
    host: str
    slots: tuple[int, ...]

    @property
    def size(self) -> int:
        """How many slots the agent has."""
        return len(self.slots)


@dataclass(frozen=True)
class ResourcePool:
    """Agents that trials of one pool share, with Determined's fitting options.

    ``allowing_heterogeneous_fits`` lets a trial larger than one agent span whole free
    agents of any sizes (the last one possibly in part) instead of a multiple of one
    agent size. ``fitting_policy`` picks, for a trial that fits on one agent, the agent
    with the fewest free slots that still fit ("best", keeps whole machines free for large
    trials) or the most ("worst", spreads load).

    With ``preemption``, a waiting trial of higher priority that cannot fit asks
    lower-priority running trials to checkpoint and stop; they go back to the queue and
    resume from that checkpoint (:func:`~trials.scheduler.choose_preemptions` picks them).
    Trials that have not reached their first checkpoint are spared, since stopping them
    loses all their progress, unless ``preempt_without_checkpoint`` is also set.
    """

    name: str
    agents: tuple[Agent, ...]
    allowing_heterogeneous_fits: bool = False
    fitting_policy: FittingPolicy = "best"
    preemption: bool = False
    preempt_without_checkpoint: bool = False

    @property
    def total_slots(self) -> int:
        return sum(agent.size for agent in self.agents)

    def agent(self, name: str) -> Agent:
        """The agent called ``name``; ``KeyError`` if the pool has none of that name."""
        for agent in self.agents:
            if agent.name == name:
                return agent
        raise KeyError(f"resource pool {self.name!r} has no agent {name!r}")


class UnknownPool(KeyError):
    """A resource pool name the cluster does not declare; the message lists the pools."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known

    def __str__(self) -> str:
        # KeyError's own str() would quote the whole message.
        return f"unknown resource pool {self.name!r}; pools: {', '.join(self.known) or '(none)'}"


SlotType = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class SlurmJobSettings:
    """How each trial is submitted as its own Slurm job (``sbatch``), from the cluster file.

    ``time_limit`` is in Slurm's formats (``MM``, ``HH:MM:SS``, ``D-HH:MM``...);
    ``sbatch_options`` are passed as they are (``--mem=64G``), before slotsweep's own
    options, once the cluster file has checked that none of them reaches those (see
    :mod:`trials.scheduler._sbatch_options`); ``slot_type`` says whether a slot is a
    GPU or a CPU of a node.
    """

    partition: str
    time_limit: str
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch_options: tuple[str, ...] = ()
    slot_type: SlotType = "gpu"


#: How long a Ray placement group may stay unsatisfied before the trial goes back to the
#: queue: long enough for Ray to start a node's runner (a worker process) under load, short
#: enough that a node lost between decision and reservation does not hold a trial.
DEFAULT_RAY_RESERVE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RaySettings:
    """A Ray cluster's connection and slot rules, from the cluster file's ``ray:`` block.

    ``address`` is what ``ray.init`` takes (``ray://HEAD:10001`` for a driver outside
    the cluster); None: ``$RAY_ADDRESS``. ``slot_type`` says whether a slot is a GPU or
    a CPU of a node (None: GPUs where the nodes have them). A trial whose placement
    group Ray has not reserved after ``reserve_timeout_s`` goes back to the queue.
    """

    address: str | None = None
    slot_type: SlotType | None = None
    reserve_timeout_s: float = DEFAULT_RAY_RESERVE_TIMEOUT_S


@dataclass(frozen=True)
class Cluster:
    """Every resource pool that trials can be scheduled on."""

    pools: tuple[ResourcePool, ...]
    #: Where trials run: "local" (this machine), "slurm" (job steps of an allocation),
    #: "sbatch" (one Slurm job per trial, placed by Slurm) or "ray" (actors on a Ray
    #: cluster's nodes).
    executor: str = "local"
    #: Determined's name: the network interface trials use between nodes (sets
    #: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME); None picks one per trial and logs it.
    dtrain_network_interface: str | None = None
    #: The Slurm job the agents belong to (inside ``salloc``/``sbatch``).
    slurm_job_id: str | None = None
    #: Whether slots are GPU indices; None: whether this machine has GPUs (NVML) decides.
    gpu_slots: bool | None = None
    #: With executor "sbatch": how trials are submitted (the agents are the partition's
    #: nodes, known to validate sizes; Slurm picks the nodes of each job).
    slurm_jobs: SlurmJobSettings | None = None
    #: With executor "ray": how to reach the Ray cluster whose nodes are the agents.
    ray: RaySettings | None = None
    #: Webhooks every search on this cluster posts to (the cluster file's ``notifications``).
    notifications: tuple[NotificationConfig, ...] = ()

    def pool(self, name: str) -> ResourcePool:
        """The pool called ``name``; raises :class:`UnknownPool` listing the pools otherwise."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise UnknownPool(name, [pool.name for pool in self.pools])

    @property
    def agents(self) -> tuple[tuple[ResourcePool, Agent], ...]:
        """Every (pool, agent) pair, in declaration order."""
        return tuple((pool, agent) for pool in self.pools for agent in pool.agents)
