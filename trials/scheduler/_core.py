"""The scheduler core: which waiting trials start now, and on which agents and slots.

Pure and in memory: a function of (pool, free slots, queue) with no I/O, so it is tested
exhaustively and benchmarked at cluster scale (``bench/scheduler_sim.py``). Slot
ownership across drivers lives in the database (:mod:`trials.allocations`).

Rules (Determined's, made explicit):

* Gang scheduling: a request starts only when all of its slots are free at once.
* ``slots <= `` the largest agent's size: the request packs onto ONE agent. With
  ``fitting_policy="best"`` that is the agent with the fewest free slots that still fit
  (so whole machines stay free for large trials); with ``"worst"`` the one with the most.
  Ties go to the agent declared first.
* Larger requests take whole FREE agents only: ``k`` agents of one size ``S`` with
  ``slots == k * S`` (the largest such ``S`` first, so as few machines as possible), or,
  with ``allowing_heterogeneous_fits``, free agents of any sizes, largest first, the last
  one possibly in part.
* Order: lower ``priority`` number first, then ``order`` (FIFO submission order).
* Backfilling (EASY-style reservation): the first request in that order that cannot start
  (the *blocked head*) reserves the agents it is closest to fitting on: for a one-agent
  request the large-enough agent with the most free slots; for a multi-agent request the
  ``k`` agents of its size with the most free slots. Requests behind it may start now,
  but only on agents outside that reservation. Reserved agents therefore only drain, so
  the head starts once they are free: it is never starved by a stream of smaller
  requests. (The reservation is recomputed on every call; the sum of the reserved
  agents' free slots never decreases between calls and grows whenever a trial on them
  ends, so the head waits at most ``k * S`` trial lengths, and in practice one drain.)
  A request with a strictly lower priority number still goes first: that is what
  priority means. With ``backfill=False`` the pass stops at the blocked head (plain FIFO).

Cost per decision is independent of the queue length: waiting requests are grouped by
size (a request that cannot fit means no later request of the same size can), and agents
are indexed by their number of free slots.

Example:
    >>> from trials.scheduler import Agent, ResourcePool
    >>> pool = ResourcePool("default", (Agent("a1", "h", (0, 1, 2, 3)), Agent("a2", "h", (0, 1, 2, 3))))
    >>> free = {"a1": frozenset({2, 3}), "a2": frozenset({0, 1, 2, 3})}
    >>> [(p.request_id, [(s.agent.name, s.slots) for s in p.agents])
    ...  for p in schedule(pool, free, [SlotRequest("t1", 2), SlotRequest("t2", 4, order=1)])]
    [('t1', [('a1', (2, 3))]), ('t2', [('a2', (0, 1, 2, 3))])]
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trials.scheduler._cluster import Agent, ResourcePool
from trials.scheduler._fitting import check_schedulable, size_counts

DEFAULT_PRIORITY = 42


@dataclass(frozen=True)
class SlotRequest:
    """A trial waiting for ``slots`` slots; lower ``priority`` runs first, then lower ``order``."""

    request_id: Hashable
    slots: int
    priority: int = DEFAULT_PRIORITY
    order: int = 0


@dataclass(frozen=True)
class AgentSlots:
    """The slot ids a placement uses on one agent."""

    agent: Agent
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where a request starts: one entry per agent; the first agent hosts the rendezvous."""

    request_id: Hashable
    pool: str
    agents: tuple[AgentSlots, ...]

    @property
    def slots(self) -> int:
        return sum(len(part.slots) for part in self.agents)


# A queued request in its size group's heap: (priority, order, seq, request_id).
_Entry = tuple[int, int, int, Hashable]


class SlotScheduler:
    """The scheduler's state for one pool: free slots per agent and the waiting requests.

    :func:`schedule` builds one per call; a long-lived caller (the simulation, a driver
    that keeps its queue) keeps one and updates it with :meth:`submit`, :meth:`cancel`,
    :meth:`release` and :meth:`set_free_slots`, so a decision costs no more than the
    placements it makes.

    Example:
        >>> from trials.scheduler import Agent, ResourcePool
        >>> sched = SlotScheduler(ResourcePool("default", (Agent("a1", "h", (0, 1)),)))
        >>> sched.submit(SlotRequest("t1", 2)); sched.submit(SlotRequest("t2", 1, order=1))
        >>> [p.request_id for p in sched.schedule()], sched.queued
        (['t1'], 1)
    """

    def __init__(
        self, pool: ResourcePool, free_slots: Mapping[str, Iterable[int]] | None = None
    ) -> None:
        self.pool = pool
        self._agents = pool.agents
        self._index = {agent.name: i for i, agent in enumerate(self._agents)}
        if len(self._index) != len(self._agents):
            raise ValueError(f"resource pool {pool.name!r} declares an agent name twice")
        self._size = [agent.size for agent in self._agents]
        self._total = sum(self._size)
        self._max = max(self._size, default=0)
        self._sizes_desc = sorted({s for s in self._size if s > 0}, reverse=True)
        self._mixed_sizes = len(self._sizes_desc) > 1
        self._counts = size_counts(pool)
        self._best = pool.fitting_policy == "best"
        self._hetero = pool.allowing_heterogeneous_fits
        self._free_ids: list[set[int]] = []
        self._nfree: list[int] = []
        # Agents indexed by their number of free slots, and fully free agents by size:
        # a fit looks at a few buckets instead of scanning every agent.
        self._by_free: list[set[int]] = []
        self._whole: dict[int, set[int]] = {}
        self._free_total = 0
        self.set_free_slots(free_slots)
        self._groups: dict[int, list[_Entry]] = {}
        self._live: dict[Hashable, tuple[int, SlotRequest]] = {}
        self._seq = 0
        self._checked_sizes: set[int] = set()
        self.reserved: tuple[str, ...] = ()
        """Agents held back for the blocked head request by the last :meth:`schedule`."""

    # -- free slots ---------------------------------------------------------------

    def set_free_slots(self, free_slots: Mapping[str, Iterable[int]] | None) -> None:
        """Replace the free slots of every agent (``None``: all free; missing agent: none free)."""
        if free_slots is not None:
            unknown = sorted(set(free_slots) - set(self._index))
            if unknown:
                raise ValueError(
                    f"free_slots names agents not in resource pool {self.pool.name!r}: "
                    f"{', '.join(unknown)}"
                )
        self._free_ids = []
        for agent in self._agents:
            if free_slots is None:
                ids = set(agent.slots)
            else:
                ids = set(free_slots.get(agent.name, ()))
                if ids and not ids.issubset(agent.slots):
                    stray = sorted(ids.difference(agent.slots))
                    raise ValueError(f"agent {agent.name!r} has no slots {stray}")
            self._free_ids.append(ids)
        self._nfree = [len(ids) for ids in self._free_ids]
        self._by_free = [set() for _ in range(self._max + 1)]
        self._whole = {size: set() for size in self._sizes_desc}
        for i, n in enumerate(self._nfree):
            self._by_free[n].add(i)
            if n == self._size[i] and n > 0:
                self._whole[n].add(i)
        self._free_total = sum(self._nfree)

    def free_slots(self) -> dict[str, frozenset[int]]:
        """Each agent's free slot ids now."""
        return {
            a.name: frozenset(ids) for a, ids in zip(self._agents, self._free_ids, strict=True)
        }

    @property
    def free_total(self) -> int:
        return self._free_total

    @property
    def used_total(self) -> int:
        return self._total - self._free_total

    def release(self, placement: Placement) -> None:
        """Give a finished (or failed-to-start) placement's slots back."""
        for part in placement.agents:
            i = self._index[part.agent.name]
            ids = set(part.slots)
            if ids & self._free_ids[i] or not ids <= set(self._agents[i].slots):
                raise ValueError(
                    f"agent {part.agent.name!r}: slots {sorted(ids)} are not all in use"
                )
            self._move(i, self._nfree[i] + len(ids))
            self._free_ids[i] |= ids

    def _take(self, i: int, n: int) -> tuple[int, ...]:
        ids = tuple(sorted(self._free_ids[i])[:n])
        self._free_ids[i].difference_update(ids)
        self._move(i, self._nfree[i] - n)
        return ids

    def _move(self, i: int, new: int) -> None:
        old = self._nfree[i]
        size = self._size[i]
        self._by_free[old].discard(i)
        self._by_free[new].add(i)
        if old == size:
            self._whole[size].discard(i)
        if new == size:
            self._whole[size].add(i)
        self._nfree[i] = new
        self._free_total += new - old

    # -- queue --------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        """Queue a request; :class:`Unschedulable` if the pool could never run it."""
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id!r} is already queued")
        if request.slots not in self._checked_sizes:
            check_schedulable(self.pool, request.slots)
            self._checked_sizes.add(request.slots)
        seq = self._seq
        self._seq += 1
        self._live[request.request_id] = (seq, request)
        group = self._groups.setdefault(request.slots, [])
        heapq.heappush(group, (request.priority, request.order, seq, request.request_id))

    def cancel(self, request_id: Hashable) -> bool:
        """Drop a queued request; False if it was not queued. (Heaps skip it lazily.)"""
        return self._live.pop(request_id, None) is not None

    @property
    def queued(self) -> int:
        return len(self._live)

    def _peek(self, size: int) -> _Entry | None:
        group = self._groups[size]
        while group:
            entry = group[0]
            live = self._live.get(entry[3])
            if live is not None and live[0] == entry[2]:
                return entry
            heapq.heappop(group)
        return None

    # -- decisions ----------------------------------------------------------------

    def schedule(self, *, backfill: bool = True) -> list[Placement]:
        """Start what can start now; the placements' slots count as used from here on."""
        heads: list[tuple[int, int, int, int]] = []
        for size in self._groups:
            entry = self._peek(size)
            if entry is not None:
                heads.append((entry[0], entry[1], entry[2], size))
        heapq.heapify(heads)
        placements: list[Placement] = []
        reserved: frozenset[int] = frozenset()
        blocked = False
        available = self._free_total
        while heads and available > 0:
            size = heapq.heappop(heads)[3]
            fit = self._fit(size, reserved)
            if fit is None:
                # Capacity only shrinks during a pass, so no later request of this size
                # fits either: the whole group is skipped until the next call.
                if blocked:
                    continue
                blocked = True
                if not backfill:
                    break
                reserved = self._reserve(size)
                available -= sum(self._nfree[i] for i in reserved)
                continue
            _, _, _, request_id = heapq.heappop(self._groups[size])
            del self._live[request_id]
            parts = tuple(AgentSlots(self._agents[i], self._take(i, n)) for i, n in fit)
            placements.append(Placement(request_id, self.pool.name, parts))
            available -= size
            entry = self._peek(size)
            if entry is not None:
                heapq.heappush(heads, (entry[0], entry[1], entry[2], size))
        self.reserved = tuple(self._agents[i].name for i in sorted(reserved))
        return placements

    def _fit(self, slots: int, reserved: frozenset[int]) -> list[tuple[int, int]] | None:
        """(agent index, slot count) pairs for a request of ``slots``, avoiding ``reserved``."""
        if slots <= self._max:
            i = self._fit_one(slots, reserved)
            return None if i is None else [(i, slots)]
        if self._hetero:
            return self._fit_heterogeneous(slots, reserved)
        for size in self._sizes_desc:
            if slots % size:
                continue
            whole = self._whole[size]
            candidates = whole - reserved if reserved else whole
            k = slots // size
            if len(candidates) >= k:
                return [(i, size) for i in sorted(candidates)[:k]]
        return None

    def _fit_one(self, slots: int, reserved: frozenset[int]) -> int | None:
        counts = range(slots, self._max + 1) if self._best else range(self._max, slots - 1, -1)
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
        size = self._size
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

    def _reserve(self, slots: int) -> frozenset[int]:
        """The agents the blocked head request will start on once they drain."""
        size = self._size
        if slots <= self._max:
            # One agent large enough to hold the request.
            eligible = [s for s in self._sizes_desc if s >= slots]
            count, cover = 1, 0
        elif self._hetero:
            # Whole agents of any sizes that add up to the request.
            eligible = self._sizes_desc
            count, cover = len(self._agents), slots
        else:
            # ``k`` agents of the size the request is a multiple of.
            wanted = next(
                s for s in self._sizes_desc if slots % s == 0 and slots // s <= self._counts[s]
            )
            eligible, count, cover = [wanted], slots // wanted, 0
        chosen: list[int] = []
        covered = 0
        # Most free slots first: those agents drain soonest, so the head waits least.
        for n in range(self._max, -1, -1):
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


def schedule(
    pool: ResourcePool,
    free_slots: Mapping[str, frozenset[int]],
    queue: Sequence[SlotRequest],
    *,
    backfill: bool = True,
) -> list[Placement]:
    """The placements to start now for ``queue`` on ``pool`` (see the module's rules).

    ``free_slots`` maps agent name to its free slot ids (a missing agent has none free).
    Raises :class:`~trials.scheduler.Unschedulable` for a request the pool can never run,
    and ``ValueError`` for a request id queued twice.

    Example (the 4-slot head is blocked and reserves both agents, so the 1-slot request
    behind it does not take a1's free slots and delay it):
        >>> from trials.scheduler import Agent, ResourcePool
        >>> pool = ResourcePool("default", (Agent("a1", "h", (0, 1)), Agent("a2", "h", (0, 1))))
        >>> [p.request_id for p in schedule(pool, {"a1": frozenset({0, 1}), "a2": frozenset()},
        ...                                 [SlotRequest("big", 4), SlotRequest("small", 1, order=1)])]
        []
    """
    scheduler = SlotScheduler(pool, free_slots)
    for request in queue:
        scheduler.submit(request)
    return scheduler.schedule(backfill=backfill)
