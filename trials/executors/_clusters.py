"""Which cluster a search runs on: the cluster file, Slurm's or Ray's nodes, or this machine.

The scheduler validates a cluster file (:func:`trials.scheduler.read_cluster`); a file
with ``executor: slurm`` leaves the agents to Slurm, and only the Slurm executors know
how to ask it: the allocation's nodes (:func:`~trials.executors._slurm.allocation_cluster`)
or a partition's (:func:`~trials.executors._slurm_jobs.partition_cluster`); one with
``executor: ray`` to Ray (:func:`~trials.executors._ray.ray_cluster`). Here they meet,
so the scheduler never imports an executor.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from trials.config import YamlError, read_yaml
from trials.executors._ray import ray_cluster
from trials.executors._slurm import allocation_cluster
from trials.executors._slurm_jobs import partition_cluster
from trials.scheduler import (
    CLUSTER_ENV_VAR,
    SLURM_CLUSTER,
    Cluster,
    ClusterConfigError,
    RayNodes,
    SlurmNodes,
    local_cluster,
    read_cluster,
)


def slurm_cluster(nodes: SlurmNodes) -> Cluster:
    """The cluster of ``nodes`` as Slurm lists them (a partition's, or the allocation's)."""
    if nodes.jobs is not None:
        cluster = partition_cluster(
            nodes.jobs,
            slot_type=nodes.slot_type,
            dtrain_network_interface=nodes.dtrain_network_interface,
        )
    else:
        cluster = allocation_cluster(dtrain_network_interface=nodes.dtrain_network_interface)
    return replace(cluster, notifications=nodes.notifications)


def parse_cluster(raw: Any) -> Cluster:
    """A loaded cluster document as a cluster; raises :class:`ClusterConfigError` listing every problem.

    Example:
        >>> cluster = parse_cluster({"resource_pools": [{"name": "default",
        ...     "agents": [{"name": "a1", "slots": 2}]}]})
        >>> cluster.pool("default").agents[0].slots
        (0, 1)
    """
    found = read_cluster(raw)
    if isinstance(found, SlurmNodes):
        return slurm_cluster(found)
    if isinstance(found, RayNodes):
        return replace(ray_cluster(found), notifications=found.notifications)
    return found


def load_cluster(path: str | Path | None = None, *, slots: int | None = None) -> Cluster:
    """The cluster from ``path``, else ``$SLOTSWEEP_CLUSTER``, else :func:`local_cluster`.

    ``slots`` sizes the local machine's agent and cannot be combined with a file, which
    declares every agent's slots itself.

    Without a file, ``load_cluster(slots=2)`` is this machine with its first two GPUs,
    or CPU slots ``(0, 1)`` where it has none. From a file:

    Example:
        >>> path = folder / "cluster.yaml"
        >>> _ = path.write_text("resource_pools:\\n- {name: default, agents: [{name: a1, slots: 2}]}\\n")
        >>> load_cluster(path).pool("default").agents[0].slots
        (0, 1)
    """
    source = "cluster"
    if path is None and os.environ.get(CLUSTER_ENV_VAR):
        path, source = os.environ[CLUSTER_ENV_VAR], CLUSTER_ENV_VAR
    in_allocation = bool(os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_JOB_NODELIST"))
    if str(path) == SLURM_CLUSTER or (path is None and in_allocation and slots is None):
        # Inside salloc/sbatch the allocation's nodes are the agents.
        if slots is not None:
            raise ClusterConfigError(
                ["slots: cannot be combined with --cluster slurm; Slurm gives each node's slots"]
            )
        return allocation_cluster()
    if path is None:
        return local_cluster(slots)
    if slots is not None:
        raise ClusterConfigError(
            [
                f"slots: cannot be combined with a cluster file ({source}); the file sets each agent's slots"
            ]
        )
    path = Path(path)
    try:
        raw = read_yaml(path, source=source, field_prefix=f"{source} {path}: ")
    except YamlError as exc:
        raise ClusterConfigError(exc.problems) from None
    try:
        return parse_cluster(raw)
    except ClusterConfigError as exc:
        raise ClusterConfigError(
            [f"{source} {path}: {problem}" for problem in exc.problems]
        ) from None
