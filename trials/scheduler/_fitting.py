"""Which ``slots_per_trial`` values a resource pool can ever run (Determined's fitting rules).

A trial with ``slots_per_trial <= `` the largest agent's size fits on one agent. A larger
trial takes whole agents: without heterogeneous fits it must be a multiple ``k * S`` of
one agent size ``S`` with at least ``k`` agents of that size; with heterogeneous fits any
total up to the pool's slot count works (whole agents of any sizes, the last possibly in
part). Anything else would wait forever, so it is rejected when it is submitted.

Example:
    >>> from trials.scheduler import Agent, ResourcePool
    >>> pool = ResourcePool("default", tuple(Agent(f"a{i}", "h", tuple(range(8))) for i in range(4)))
    >>> valid_slots_per_trial(pool)[-4:]
    [8, 16, 24, 32]
    >>> check_schedulable(pool, 12)
    Traceback (most recent call last):
    ...
    trials.scheduler._fitting.Unschedulable: resource pool 'default' cannot fit slots_per_trial=12 (a trial larger than one agent takes whole agents of one size): agents have 8 slots (x4); valid slots_per_trial: 1-8, 16, 24, 32
"""

from __future__ import annotations

from collections import Counter

from trials.scheduler._cluster import ResourcePool


class Unschedulable(ValueError):
    """A request its pool can never run; ``str()`` is one line with the valid values."""

    def __init__(self, message: str, *, pool: str, slots_per_trial: int, valid: list[int]) -> None:
        super().__init__(message)
        self.pool = pool
        self.slots_per_trial = slots_per_trial
        self.valid = valid


def size_counts(pool: ResourcePool) -> Counter[int]:
    """How many agents of each size (in slots) the pool has; empty agents are ignored."""
    return Counter(agent.size for agent in pool.agents if agent.size > 0)


def fits_ever(
    pool: ResourcePool, slots_per_trial: int, counts: Counter[int] | None = None
) -> bool:
    """Whether an otherwise idle pool could run a trial of ``slots_per_trial`` slots."""
    counts = size_counts(pool) if counts is None else counts
    if slots_per_trial < 1 or not counts:
        return False
    if slots_per_trial <= max(counts):
        return True
    if pool.allowing_heterogeneous_fits:
        return slots_per_trial <= sum(size * n for size, n in counts.items())
    return any(
        slots_per_trial % size == 0 and slots_per_trial // size <= n for size, n in counts.items()
    )


def valid_slots_per_trial(pool: ResourcePool) -> list[int]:
    """Every ``slots_per_trial`` the pool can run, ascending (empty for a pool without agents)."""
    counts = size_counts(pool)
    if not counts:
        return []
    largest = max(counts)
    if pool.allowing_heterogeneous_fits:
        return list(range(1, sum(size * n for size, n in counts.items()) + 1))
    valid = set(range(1, largest + 1))
    for size, n in counts.items():
        valid.update(k * size for k in range(2, n + 1) if k * size > largest)
    return sorted(valid)


def largest_fit(pool: ResourcePool, slots_per_trial: int) -> int:
    """``slots_per_trial``, or the largest smaller size the pool can run when it cannot run
    that one (``resources.shrink_to_fit``); raises :class:`Unschedulable` when the pool
    can run no trial at all.

    Example:
        >>> from trials.scheduler import Agent, ResourcePool
        >>> one_gpu = ResourcePool("default", (Agent("a1", "h", (0,)),))
        >>> largest_fit(one_gpu, 2), largest_fit(one_gpu, 1)
        (1, 1)
    """
    if fits_ever(pool, slots_per_trial):
        return slots_per_trial
    smaller = [size for size in valid_slots_per_trial(pool) if size < slots_per_trial]
    if not smaller:
        # No agent with slots: the pool's refusal says so.
        check_schedulable(pool, slots_per_trial)
    return smaller[-1]


def check_schedulable(pool: ResourcePool, slots_per_trial: int) -> None:
    """Raise :class:`Unschedulable` unless the pool can ever run ``slots_per_trial`` slots.

    Called when an experiment is submitted, so a request that could never start is
    refused up front instead of waiting forever (Determined would leave it queued).
    """
    counts = size_counts(pool)
    if fits_ever(pool, slots_per_trial, counts):
        return
    valid = valid_slots_per_trial(pool)
    if not counts:
        message = f"resource pool {pool.name!r} has no agents with slots; it cannot run any trial"
    else:
        total = sum(size * n for size, n in counts.items())
        if slots_per_trial < 1:
            why = " (it must be at least 1)"
        elif slots_per_trial > total:
            why = f" (more than the pool's {total} slots)"
        else:
            why = " (a trial larger than one agent takes whole agents of one size)"
        hetero = ", heterogeneous fits allowed" if pool.allowing_heterogeneous_fits else ""
        message = (
            f"resource pool {pool.name!r} cannot fit slots_per_trial={slots_per_trial}{why}: "
            f"agents have {describe_agent_sizes(counts)}{hetero}; "
            f"valid slots_per_trial: {format_values(valid)}"
        )
    raise Unschedulable(message, pool=pool.name, slots_per_trial=slots_per_trial, valid=valid)


def job_shape(pool: ResourcePool, slots_per_trial: int) -> tuple[int, int]:
    """(nodes, slots per node) of a trial that a cluster engine places, by the same rules.

    A trial that fits on one agent takes one node; a larger one takes ``k`` whole
    nodes of the largest agent size ``S`` with ``slots_per_trial == k * S`` (as few
    nodes as possible). Raises :class:`Unschedulable` when no shape exists.

    Example:
        >>> from trials.scheduler import Agent, ResourcePool
        >>> pool = ResourcePool("p", tuple(Agent(f"n{i}", "h", (0, 1, 2, 3)) for i in range(4)))
        >>> job_shape(pool, 2), job_shape(pool, 8)
        ((1, 2), (2, 4))
    """
    counts = size_counts(pool)
    if counts and 1 <= slots_per_trial <= max(counts):
        return 1, slots_per_trial
    for size in sorted(counts, reverse=True):
        nodes, rest = divmod(slots_per_trial, size)
        if rest == 0 and nodes <= counts[size]:
            return nodes, size
    check_schedulable(pool, slots_per_trial)
    # Only heterogeneous fits could run it, and one job has one shape.
    raise Unschedulable(
        f"resource pool {pool.name!r} cannot run slots_per_trial={slots_per_trial} as one "
        f"job of whole nodes of one size ({describe_agent_sizes(counts)})",
        pool=pool.name,
        slots_per_trial=slots_per_trial,
        valid=[],
    )


def describe_agent_sizes(counts: Counter[int]) -> str:
    """``8 slots (x4), 4 slots (x2)``: agent sizes, largest first, with how many of each."""
    return ", ".join(
        f"{size} slot{'s' if size != 1 else ''} (x{counts[size]})"
        for size in sorted(counts, reverse=True)
    )


def format_values(values: list[int]) -> str:
    """Sorted integers compactly: runs as ``1-8``, long progressions as ``16, 24, ..., 4096``.

    Example:
        >>> format_values([1, 2, 3, 4, 16, 24, 32])
        '1-4, 16, 24, 32'
        >>> format_values([1, 2, 3, 16, 24, 32, 40, 48])
        '1-3, 16, 24, ..., 48'
    """
    if not values:
        return "none"
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] - values[j] == 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}-{values[j]}")
            i = j + 1
            continue
        if i + 1 < len(values):
            step = values[i + 1] - values[i]
            j = i + 1
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
            if j - i >= 3:
                parts.append(f"{values[i]}, {values[i] + step}, ..., {values[j]}")
                i = j + 1
                continue
        parts.append(str(values[i]))
        i += 1
    return ", ".join(parts)
