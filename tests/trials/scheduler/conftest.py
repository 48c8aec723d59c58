"""Helpers to build pools and free-slot maps for the scheduler's pure tests."""

from __future__ import annotations

from collections.abc import Sequence

from trials.scheduler import Agent, FittingPolicy, ResourcePool


def make_pool(
    sizes: Sequence[int],
    *,
    heterogeneous: bool = False,
    policy: FittingPolicy = "best",
    name: str = "default",
) -> ResourcePool:
    """Agents ``a0, a1, ...`` on 127.0.0.1 with ``sizes[i]`` slots numbered from 0."""
    return ResourcePool(
        name=name,
        agents=tuple(
            Agent(name=f"a{i}", host="127.0.0.1", slots=tuple(range(size)))
            for i, size in enumerate(sizes)
        ),
        allowing_heterogeneous_fits=heterogeneous,
        fitting_policy=policy,
    )


def all_free(pool: ResourcePool) -> dict[str, frozenset[int]]:
    return {agent.name: frozenset(agent.slots) for agent in pool.agents}


def free_counts(pool: ResourcePool, counts: Sequence[int]) -> dict[str, frozenset[int]]:
    """Agent i has its last ``counts[i]`` slots free (the first ones are in use)."""
    return {
        agent.name: frozenset(agent.slots[agent.size - n :]) if n else frozenset()
        for agent, n in zip(pool.agents, counts, strict=True)
    }
