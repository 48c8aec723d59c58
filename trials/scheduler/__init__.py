"""slotsweep's slot-aware scheduler: agents, resource pools, fits and the cluster file.

The core (:func:`schedule`) is a pure function of a pool, its free slots and the queue
of waiting requests; :func:`load_cluster` is the only I/O here. Slot ownership across
drivers lives in the database (:mod:`trials.coordination.allocations`).

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
    ResourcePool,
    SlotType,
    SlurmJobSettings,
    UnknownPool,
)
from trials.scheduler._cluster_file import (
    CLUSTER_ENV_VAR,
    DEFAULT_POOL,
    ClusterConfigError,
    load_cluster,
    local_cluster,
    parse_cluster,
)
from trials.scheduler._core import (
    DEFAULT_PRIORITY,
    AgentSlots,
    Placement,
    SlotRequest,
    SlotScheduler,
    WaitReason,
    schedule,
)
from trials.scheduler._fitting import (
    Unschedulable,
    check_schedulable,
    format_values,
    job_shape,
    valid_slots_per_trial,
)
from trials.scheduler._preemption import RunningRequest, choose_preemptions

__all__ = [
    "CLUSTER_ENV_VAR",
    "DEFAULT_POOL",
    "DEFAULT_PRIORITY",
    "Agent",
    "AgentSlots",
    "Cluster",
    "ClusterConfigError",
    "FittingPolicy",
    "Placement",
    "ResourcePool",
    "RunningRequest",
    "SlotRequest",
    "SlotScheduler",
    "SlotType",
    "SlurmJobSettings",
    "UnknownPool",
    "Unschedulable",
    "WaitReason",
    "check_schedulable",
    "choose_preemptions",
    "format_values",
    "job_shape",
    "load_cluster",
    "local_cluster",
    "parse_cluster",
    "schedule",
    "valid_slots_per_trial",
]
