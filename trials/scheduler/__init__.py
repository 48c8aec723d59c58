"""slotsweep's slot-aware scheduler: agents, resource pools, fits and the cluster file.

The core (:func:`schedule`) is a pure function of a pool, its free slots and the queue
of waiting requests; :func:`read_cluster` validates a cluster file and
:func:`local_cluster` (which asks NVML for this machine's GPUs) is the only I/O here.
Slot ownership across drivers lives in the database (:mod:`trials.coordination.allocations`).

May import the base modules of ``trials`` only: every other part of ``trials`` builds on
it. Which cluster a search runs on, where Slurm or Ray must be asked, is the executors' part
(:func:`trials.executors.load_cluster`).

Example:
    >>> from trials.scheduler import Agent, ResourcePool, SlotRequest, schedule
    >>> pool = ResourcePool("default", (Agent("a1", "127.0.0.1", (0, 1)),))
    >>> [p.agents[0].slots for p in schedule(pool, {"a1": frozenset({0, 1})}, [SlotRequest("t", 2)])]
    [(0, 1)]
"""

from trials.scheduler._cluster import (
    Agent,
    Cluster,
    FittingPolicy,
    RaySettings,
    ResourcePool,
    SlotType,
    SlurmJobSettings,
    UnknownPool,
)
from trials.scheduler._cluster_file import (
    CLUSTER_ENV_VAR,
    DEFAULT_POOL,
    MAX_SLOTS_PER_AGENT,
    SLURM_CLUSTER,
    ClusterConfigError,
    RayNodes,
    SlurmNodes,
    local_cluster,
    read_cluster,
)
from trials.scheduler._core import (
    AgentSlots,
    Placement,
    SlotRequest,
    SlotScheduler,
    schedule,
)
from trials.scheduler._fitting import (
    Unschedulable,
    check_schedulable,
    format_values,
    job_shape,
    largest_fit,
    valid_slots_per_trial,
)
from trials.scheduler._preemption import RunningRequest, choose_preemptions
from trials.scheduler._wait_reasons import WaitReason

__all__ = [
    "CLUSTER_ENV_VAR",
    "DEFAULT_POOL",
    "MAX_SLOTS_PER_AGENT",
    "SLURM_CLUSTER",
    "Agent",
    "AgentSlots",
    "Cluster",
    "ClusterConfigError",
    "FittingPolicy",
    "Placement",
    "RayNodes",
    "RaySettings",
    "ResourcePool",
    "RunningRequest",
    "SlotRequest",
    "SlotScheduler",
    "SlotType",
    "SlurmJobSettings",
    "SlurmNodes",
    "UnknownPool",
    "Unschedulable",
    "WaitReason",
    "check_schedulable",
    "choose_preemptions",
    "format_values",
    "job_shape",
    "largest_fit",
    "local_cluster",
    "read_cluster",
    "schedule",
    "valid_slots_per_trial",
]
