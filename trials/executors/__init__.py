"""Where trial attempts run: the executor seam and its implementations.

``LocalExecutor`` starts ``torchrun`` on this machine; ``SlurmExecutor`` starts each
attempt as a Slurm job step inside the allocation the search runs in;
``SbatchExecutor`` submits each attempt as a Slurm job of its own; ``RayExecutor``
starts each attempt as a placement group on a Ray cluster and its nodes' runners. The driver
talks to :class:`Executor` only; :func:`executor_for` picks one for a cluster and
:func:`executor_named` finds the one that started a recorded run. Which cluster a
search runs on is decided here too (:func:`load_cluster`): a Slurm cluster's agents are
what Slurm says, a Ray cluster's what Ray says, and only these executors ask them. Each executor records and ends the
rows of the processes it starts (:func:`mark_processes_ended`).

May import ``storage``, the base modules of ``trials``, :mod:`trials.scheduler`,
:mod:`trials.launch` and :mod:`trials.node` (a Slurm node runs the ``torchrun``
wrapper); :mod:`trials.coordination` builds on it, nothing else in ``trials`` imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trials.executors._base import Executor, JobEnding, LaunchRequest, TrialJob
from trials.executors._clusters import load_cluster, parse_cluster, slurm_cluster
from trials.executors._local import LocalExecutor
from trials.executors._process_rows import mark_processes_ended
from trials.executors._ray import RayError, RayExecutor
from trials.executors._slurm import SlurmExecutor
from trials.executors._slurm_jobs import SbatchExecutor
from trials.launch.processes import is_local_host

if TYPE_CHECKING:
    from trials.scheduler import Cluster, ResourcePool

__all__ = [
    "Executor",
    "JobEnding",
    "LaunchRequest",
    "LocalExecutor",
    "RayError",
    "RayExecutor",
    "SbatchExecutor",
    "SlurmExecutor",
    "TrialJob",
    "database_problem",
    "executor_for",
    "executor_named",
    "load_cluster",
    "mark_processes_ended",
    "parse_cluster",
    "reach_problem",
    "slurm_cluster",
]


def executor_for(cluster: Cluster) -> Executor:
    """The executor that runs ``cluster``'s trials (its ``executor`` field)."""
    if cluster.executor == "slurm":
        return SlurmExecutor(cluster)
    if cluster.executor == "sbatch":
        return SbatchExecutor(cluster)
    if cluster.executor == "ray":
        return RayExecutor(cluster)
    return LocalExecutor(use_gpus=cluster.gpu_slots)


def executor_named(name: str) -> Executor:
    """The executor recorded as ``TrialRun.executor``, to end a crashed driver's leftovers."""
    if name == "slurm":
        return SlurmExecutor(None)
    if name == "sbatch":
        return SbatchExecutor(None)
    if name == "ray":
        # The cluster this process loaded connected it; else $RAY_ADDRESS says where.
        return RayExecutor(None)
    if name == "local":
        return LocalExecutor()
    raise ValueError(f"executor: unknown executor {name!r} (local, slurm, sbatch, ray)")


def database_problem(executor: Executor, db_url: str) -> str | None:
    """Why ``db_url`` cannot serve ``executor``'s ranks, or None.

    Ranks on other hosts write to the database concurrently: SQLite on a network
    filesystem corrupts under that (its locks do not hold there), so such executors
    need PostgreSQL.

    Example:
        >>> database_problem(LocalExecutor(), "sqlite:///s.db") is None
        True
    """
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        backend = make_url(db_url).get_backend_name()
    except ArgumentError:
        return None  # not a URL at all: the database's own check says so
    if executor.remote and backend == "sqlite":
        return (
            f"database: SQLite cannot be shared by the {executor.name} executor's nodes "
            "(its file locks do not hold on a network filesystem); use PostgreSQL: "
            "--db postgresql+psycopg://USER@HOST/DB"
        )
    return None


def reach_problem(executor: Executor, pool: ResourcePool) -> str | None:
    """Why ``executor`` cannot start trials on one of ``pool``'s agents, or None.

    An executor that is not :attr:`~Executor.remote` starts processes on this machine
    only: an agent on another host would be accepted and every trial placed on it would
    fail at launch, so it is refused when the run is submitted.

    Example:
        >>> from trials.scheduler import Agent, ResourcePool
        >>> pool = ResourcePool("default", (Agent("a", "gpu-7", (0,)),))
        >>> print(reach_problem(LocalExecutor(), pool))
        cluster: agent 'a' of resource pool 'default' is on host 'gpu-7'; the local executor starts trials on this machine only (its agents' host: localhost, 127.0.0.1 or this machine's name); run slotsweep on that host, or use executor: slurm or executor: ray
    """
    if executor.remote:
        return None
    for agent in pool.agents:
        if not is_local_host(agent.host):
            return (
                f"cluster: agent '{agent.name}' of resource pool '{pool.name}' is on host "
                f"'{agent.host}'; the {executor.name} executor starts trials on this machine "
                "only (its agents' host: localhost, 127.0.0.1 or this machine's name); run "
                "slotsweep on that host, or use executor: slurm or executor: ray"
            )
    return None
