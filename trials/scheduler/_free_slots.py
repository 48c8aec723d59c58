"""The free slots of one pool's agents, indexed for fitting: where a request of ``n`` slots goes.

The bookkeeping half of the scheduler core (:class:`~trials.scheduler.SlotScheduler`
keeps the queue and the order): which slot ids each agent has free, agents indexed by
their number of free slots and fully free agents by size, so a fit looks at a few
buckets instead of scanning every agent. The fitting and reservation rules are the
core's (see :mod:`trials.scheduler._core`); agents are referred to by their index in
the pool, in declaration order, which is also the order ties go by.

Example:
    >>> from trials.scheduler import Agent, ResourcePool
    >>> free = FreeSlots(ResourcePool("p", (Agent("a1", "h", (0, 1)), Agent("a2", "h", (0, 1)))))
    >>> free.set({"a1": {1}, "a2": {0, 1}})
    >>> free.fit(1, frozenset()), free.fit(4, frozenset()), free.fit(2, frozenset({1}))
    ([(0, 1)], None, None)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trials.scheduler._cluster import ResourcePool
from trials.scheduler._fitting import size_counts


class FreeSlots:
    """Each agent's free slot ids in one pool, and the fits and reservations they allow.

    Pure bookkeeping: what to take is the caller's decision, which agents a request fits
    on is this class's. The attributes are read by the scheduler's hot loop directly
    (``nfree``, ``free_total``, ``agents``); only the methods change them.
    """

    def __init__(self, pool: ResourcePool) -> None:
        self.pool = pool
        self.agents = pool.agents
        self.index = {agent.name: i for i, agent in enumerate(self.agents)}
        if len(self.index) != len(self.agents):
            raise ValueError(f"resource pool {pool.name!r} declares an agent name twice")
        self.size = [agent.size for agent in self.agents]
        self.total = sum(self.size)
        self.largest = max(self.size, default=0)
        self.sizes_desc = sorted({s for s in self.size if s > 0}, reverse=True)
        self._mixed_sizes = len(self.sizes_desc) > 1
        self._counts = size_counts(pool)
        self._best = pool.fitting_policy == "best"
        self.heterogeneous = pool.allowing_heterogeneous_fits
        self._free_ids: list[set[int]] = []
        self.nfree: list[int] = []
        """Free slots per agent index."""
        # Agents indexed by their number of free slots, and fully free agents by size.
        self._by_free: list[set[int]] = []
        self._whole: dict[int, set[int]] = {}
        self.free_total = 0
        """Free slots in the pool."""

    def set(self, free_slots: Mapping[str, Iterable[int]] | None) -> None:
        """Replace the free slots of every agent (``None``: all free; missing agent: none free)."""
        if free_slots is not None:
            unknown = sorted(set(free_slots) - set(self.index))
            if unknown:
                raise ValueError(
                    f"free_slots names agents not in resource pool {self.pool.name!r}: "
                    f"{', '.join(unknown)}"
                )
        self._free_ids = []
        for agent in self.agents:
            if free_slots is None:
                ids = set(agent.slots)
            else:
                ids = set(free_slots.get(agent.name, ()))
                if ids and not ids.issubset(agent.slots):
                    stray = sorted(ids.difference(agent.slots))
                    raise ValueError(f"agent {agent.name!r} has no slots {stray}")
            self._free_ids.append(ids)
        self.nfree = [len(ids) for ids in self._free_ids]
        self._by_free = [set() for _ in range(self.largest + 1)]
        self._whole = {size: set() for size in self.sizes_desc}
        for i, n in enumerate(self.nfree):
            self._by_free[n].add(i)
            if n == self.size[i] and n > 0:
                self._whole[n].add(i)
        self.free_total = sum(self.nfree)

    def by_agent(self) -> dict[str, frozenset[int]]:
        """Each agent's free slot ids now, by agent name."""
        return {a.name: frozenset(ids) for a, ids in zip(self.agents, self._free_ids, strict=True)}

    def take(self, i: int, n: int) -> tuple[int, ...]:
        """Mark the ``n`` lowest free slot ids of agent ``i`` used, and return them."""
        ids = tuple(sorted(self._free_ids[i])[:n])
        self._free_ids[i].difference_update(ids)
        self._move(i, self.nfree[i] - n)
        return ids

    def give_back(self, agent: str, slots: Iterable[int]) -> None:
        """Mark ``slots`` of ``agent`` free again; ``ValueError`` if any of them is not in use."""
        i = self.index[agent]
        ids = set(slots)
        if ids & self._free_ids[i] or not ids <= set(self.agents[i].slots):
            raise ValueError(f"agent {agent!r}: slots {sorted(ids)} are not all in use")
        self._move(i, self.nfree[i] + len(ids))
        self._free_ids[i] |= ids

    def _move(self, i: int, new: int) -> None:
        """Re-index agent ``i`` under its new number of free slots."""
        old = self.nfree[i]
        size = self.size[i]
        self._by_free[old].discard(i)
        self._by_free[new].add(i)
        if old == size:
            self._whole[size].discard(i)
        if new == size:
            self._whole[size].add(i)
        self.nfree[i] = new
        self.free_total += new - old

    def agent_size_for(self, slots: int) -> int:
        """The agent size a multi-agent request takes whole agents of (the largest that can)."""
        return next(s for s in self.sizes_desc if slots % s == 0 and slots // s <= self._counts[s])

    def fit(self, slots: int, reserved: frozenset[int]) -> list[tuple[int, int]] | None:
        """(agent index, slot count) pairs for a request of ``slots``, avoiding ``reserved``."""
        if slots <= self.largest:
            i = self._fit_one(slots, reserved)
            return None if i is None else [(i, slots)]
        if self.heterogeneous:
            return self._fit_heterogeneous(slots, reserved)
        for size in self.sizes_desc:
            if slots % size:
                continue
            whole = self._whole[size]
            candidates = whole - reserved if reserved else whole
            k = slots // size
            if len(candidates) >= k:
                return [(i, size) for i in sorted(candidates)[:k]]
        return None

    def _fit_one(self, slots: int, reserved: frozenset[int]) -> int | None:
        largest = self.largest
        counts = range(slots, largest + 1) if self._best else range(largest, slots - 1, -1)
        for n in counts:
            bucket = self._by_free[n]
            if not bucket:
                continue
            if not reserved or reserved.isdisjoint(bucket):
                return min(bucket)
            rest = bucket - reserved
            if rest:
                return min(rest)
        return None

    def _fit_heterogeneous(
        self, slots: int, reserved: frozenset[int]
    ) -> list[tuple[int, int]] | None:
        size = self.size
        candidates = [i for whole in self._whole.values() for i in whole if i not in reserved]
        if sum(size[i] for i in candidates) < slots:
            return None
        candidates.sort(key=lambda i: (-size[i], i))
        # Largest agents whole until the rest fits on one agent: as few agents as possible.
        chosen: list[tuple[int, int]] = []
        remaining = slots
        for position, i in enumerate(candidates):
            if size[i] < remaining:
                chosen.append((i, size[i]))
                remaining -= size[i]
                continue
            fits = [j for j in candidates[position:] if size[j] >= remaining]
            # Best fit: the smallest agent that holds the rest; worst fit: the largest.
            last = min(fits, key=lambda j: (size[j], j)) if self._best else fits[0]
            chosen.append((last, remaining))
            break
        return chosen

    def reserve(self, slots: int) -> frozenset[int]:
        """The agents the blocked head request will start on once they drain."""
        size = self.size
        if slots <= self.largest:
            # One agent large enough to hold the request.
            eligible = [s for s in self.sizes_desc if s >= slots]
            count, cover = 1, 0
        elif self.heterogeneous:
            # Whole agents of any sizes that add up to the request.
            eligible = self.sizes_desc
            count, cover = len(self.agents), slots
        else:
            # ``k`` agents of the size the request is a multiple of.
            wanted = self.agent_size_for(slots)
            eligible, count, cover = [wanted], slots // wanted, 0
        chosen: list[int] = []
        covered = 0
        # Most free slots first: those agents drain soonest, so the head waits least.
        for n in range(self.largest, -1, -1):
            bucket = self._by_free[n]
            if not bucket:
                continue
            if self._mixed_sizes:
                members = sorted(
                    (i for i in bucket if size[i] in eligible), key=lambda i: (-size[i], i)
                )
            elif count - len(chosen) == 1:
                members = [min(bucket)]
            else:
                members = sorted(bucket)
            for i in members:
                chosen.append(i)
                covered += size[i]
                if len(chosen) == count or (cover and covered >= cover):
                    return frozenset(chosen)
        return frozenset(chosen)
