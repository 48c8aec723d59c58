"""The cluster's full slot list, from the scheduler's cluster model when it is installed.

Allocations in the database only name the slots that are held; which slots exist
comes from the scheduler's cluster description (``trials.executors.load_cluster``:
pools -> agents -> slots). Without it the Cluster page shows held slots only.

Example:
    >>> from types import SimpleNamespace as NS
    >>> c = NS(pools=[NS(name="default", agents=[NS(name="a0", host="127.0.0.1", slots=2)])])
    >>> [(a.pool, a.name, a.slots) for a in cluster_layout(c)]
    [('default', 'a0', (0, 1))]
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class AgentLayout:
    """One agent of one resource pool and the slot ids it offers."""

    pool: str
    name: str
    host: str
    slots: tuple[int, ...]


def _slot_ids(slots: Any) -> tuple[int, ...]:
    # The scheduler's Agent keeps a tuple of slot ids; a bare count means 0..n-1.
    return tuple(range(slots)) if isinstance(slots, int) else tuple(int(s) for s in slots)


def cluster_layout(cluster: Any) -> list[AgentLayout]:
    """Every agent of every pool of a ``trials.scheduler.Cluster``."""
    return [
        AgentLayout(pool=pool.name, name=agent.name, host=agent.host, slots=_slot_ids(agent.slots))
        for pool in cluster.pools
        for agent in pool.agents
    ]


def load_layout() -> tuple[list[AgentLayout] | None, str | None]:
    """The cluster's agents, or ``(None, why not)`` when the layout cannot be known."""
    try:
        from trials.executors import load_cluster
    except ImportError:
        return None, (
            "The cluster layout is not available here (`trials.executors.load_cluster` "
            "is not installed), so free slots are not listed: below are the slots held "
            "in the database."
        )
    try:
        cluster = load_cluster()
    except Exception as exc:  # A bad cluster file must not break the page; say why.
        return (
            None,
            f"Could not load the cluster layout ({exc}); below are the slots held in the database.",
        )
    return cluster_layout(cluster), None
