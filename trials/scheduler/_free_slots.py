"""The free slots of one pool's agents, indexed for fitting: where a request of ``n`` slots goes.

The bookkeeping half of the scheduler core (:class:`~trials.scheduler.SlotScheduler`
keeps the queue and the order): which slot ids each agent has free, agents indexed by
their number of free slots and fully free agents by size, so a fit looks at a few
buckets instead of scanning every agent. The fitting and reservation rules are the
core's (see :mod:`trials.scheduler._core`); agents are referred to by their index in
the pool, in declaration order, which is also the order ties go by.

Shares of one slot (``slots_per_trial`` 0.5, 0.25, 0.125) are counted in eighths of a
slot (:data:`~trials.config.EIGHTHS_PER_SLOT`). A slot that shares use is *shared*: it
is no longer free for a whole-slot request (a share trial and a whole trial never share
a slot) and it takes more shares while the eighths they use add up to at most one slot.
Shared slots are indexed by the eighths they have left, so packing a share into the
fullest slot it fits looks at seven buckets at most.

Example:
    >>> from trials.scheduler import Agent, ResourcePool
    >>> free = FreeSlots(ResourcePool("p", (Agent("a1", "h", (0, 1)), Agent("a2", "h", (0, 1)))))
    >>> free.set({"a1": {1}, "a2": {0, 1}})
    >>> free.fit(1, frozenset()), free.fit(4, frozenset()), free.fit(2, frozenset({1}))
    ([(0, 1)], None, None)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trials.config import EIGHTHS_PER_SLOT
from trials.scheduler._cluster import ResourcePool
from trials.scheduler._fitting import size_counts

# A shared slot's place in the index: (agent index, slot id).
_SlotKey = tuple[int, int]


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
        """Free slots in the pool (shared slots are not free)."""
        # Shares: per agent, the eighths shares use on each shared slot; shared slots by
        # the eighths they have left (index 1-8; a full one is in none); the eighths
        # left on each agent's shared slots and in the whole pool.
        self._shared: list[dict[int, int]] = []
        self._by_room: list[set[_SlotKey]] = []
        self.room: list[int] = []
        """Eighths left on each agent's shared slots."""
        self.room_total = 0
        """Eighths left on the pool's shared slots."""

    @property
    def free_eighths(self) -> int:
        """What the pool has left, in eighths of a slot: free slots and shared slots' room."""
        return self.free_total * EIGHTHS_PER_SLOT + self.room_total

    def set(
        self,
        free_slots: Mapping[str, Iterable[int]] | None,
        shared: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        """Replace the free slots of every agent (``None``: all free; missing agent: none free).

        ``shared`` gives, per agent, the eighths shares use on each shared slot (a slot
        named there is neither free nor held whole).
        """
        for given, what in ((free_slots, "free_slots"), (shared, "shared")):
            unknown = sorted(set(given or ()) - set(self.index))
            if unknown:
                raise ValueError(
                    f"{what} names agents not in resource pool {self.pool.name!r}: "
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
        self._set_shared(shared or {})
        self.nfree = [len(ids) for ids in self._free_ids]
        self._by_free = [set() for _ in range(self.largest + 1)]
        self._whole = {size: set() for size in self.sizes_desc}
        for i, n in enumerate(self.nfree):
            self._by_free[n].add(i)
            if n == self.size[i] and n > 0:
                self._whole[n].add(i)
        self.free_total = sum(self.nfree)

    def _set_shared(self, shared: Mapping[str, Mapping[int, int]]) -> None:
        self._shared = [{} for _ in self.agents]
        self._by_room = [set() for _ in range(EIGHTHS_PER_SLOT + 1)]
        self.room = [0] * len(self.agents)
        self.room_total = 0
        for name, slots in shared.items():
            i = self.index[name]
            for slot, used in slots.items():
                if slot not in self.agents[i].slots or slot in self._free_ids[i]:
                    raise ValueError(f"agent {name!r}: slot {slot} cannot be shared and free")
                if not 1 <= used <= EIGHTHS_PER_SLOT:
                    raise ValueError(
                        f"agent {name!r}: shares on slot {slot} use {used} eighths; "
                        f"1 to {EIGHTHS_PER_SLOT} are possible"
                    )
                self._open_shared(i, slot)
                self._use(i, slot, used)

    def _open_shared(self, i: int, slot: int) -> None:
        """Agent ``i``'s ``slot`` (no longer free) becomes a shared slot with nothing on it yet."""
        self._shared[i][slot] = 0
        self._by_room[EIGHTHS_PER_SLOT].add((i, slot))
        self.room[i] += EIGHTHS_PER_SLOT
        self.room_total += EIGHTHS_PER_SLOT

    def _use(self, i: int, slot: int, eighths: int) -> None:
        """Shares on agent ``i``'s shared ``slot`` use ``eighths`` more (fewer if negative)."""
        before = self._shared[i][slot]
        after = before + eighths
        if not 0 <= after <= EIGHTHS_PER_SLOT:
            raise ValueError(
                f"agent {self.agents[i].name!r}: slot {slot} has {EIGHTHS_PER_SLOT - before} "
                f"eighths left, not {eighths}"
            )
        self._by_room[EIGHTHS_PER_SLOT - before].discard((i, slot))
        if after < EIGHTHS_PER_SLOT:
            self._by_room[EIGHTHS_PER_SLOT - after].add((i, slot))
        self._shared[i][slot] = after
        self.room[i] -= eighths
        self.room_total -= eighths

    def by_agent(self) -> dict[str, frozenset[int]]:
        """Each agent's free slot ids now, by agent name."""
        return {a.name: frozenset(ids) for a, ids in zip(self.agents, self._free_ids, strict=True)}

    def shared_by_agent(self) -> dict[str, dict[int, int]]:
        """The eighths shares use on each shared slot, by agent name (agents with some only)."""
        return {
            agent.name: dict(slots)
            for agent, slots in zip(self.agents, self._shared, strict=True)
            if slots
        }

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
        if (
            ids & self._free_ids[i]
            or ids & self._shared[i].keys()
            or not ids <= set(self.agents[i].slots)
        ):
            raise ValueError(f"agent {agent!r}: slots {sorted(ids)} are not all in use")
        self._move(i, self.nfree[i] + len(ids))
        self._free_ids[i] |= ids

    def take_share(self, i: int, slot: int | None, eighths: int) -> int:
        """Put a share of ``eighths`` on agent ``i``'s shared ``slot`` (None: its lowest free
        slot, which becomes shared); the slot's id."""
        if slot is None:
            slot = min(self._free_ids[i])
            self._free_ids[i].discard(slot)
            self._move(i, self.nfree[i] - 1)
            self._open_shared(i, slot)
        self._use(i, slot, eighths)
        return slot

    def give_back_share(self, agent: str, slot: int, eighths: int) -> None:
        """Take a share of ``eighths`` off ``agent``'s ``slot``; the last one frees the slot.

        ``ValueError`` if shares do not use that much of it.
        """
        i = self.index[agent]
        if self._shared[i].get(slot, 0) < eighths:
            raise ValueError(f"agent {agent!r}: slot {slot} holds no share of {eighths} eighths")
        self._use(i, slot, -eighths)
        if self._shared[i][slot] == 0:
            del self._shared[i][slot]
            self._by_room[EIGHTHS_PER_SLOT].discard((i, slot))
            self.room[i] -= EIGHTHS_PER_SLOT
            self.room_total -= EIGHTHS_PER_SLOT
            self._move(i, self.nfree[i] + 1)
            self._free_ids[i].add(slot)

    def fit_share(self, eighths: int, reserved: frozenset[int]) -> tuple[int, int | None] | None:
        """(agent index, shared slot or None for a free one) for a share of ``eighths``.

        Best fit packs: the shared slot with the fewest eighths left that still hold the
        share (ties: agent declared first, lowest slot), and only when none has room a
        free slot, chosen as a one-slot request's (the agent with the fewest free slots),
        so free slots and whole agents stay free for whole-slot trials. Worst fit
        spreads: a free slot on the agent with the most free slots first, then the shared
        slot with the most room.
        """
        rooms = range(eighths, EIGHTHS_PER_SLOT)
        if self._best:
            return self._fit_shared(rooms, reserved) or self._fit_free_slot(reserved)
        return self._fit_free_slot(reserved) or self._fit_shared(reversed(rooms), reserved)

    def _fit_shared(
        self, rooms: Iterable[int], reserved: frozenset[int]
    ) -> tuple[int, int | None] | None:
        for room in rooms:
            bucket = self._by_room[room]
            if bucket:
                spots = [key for key in bucket if key[0] not in reserved] if reserved else bucket
                if spots:
                    return min(spots)
        return None

    def _fit_free_slot(self, reserved: frozenset[int]) -> tuple[int, int | None] | None:
        i = self._fit_one(1, reserved) if self.largest else None
        return None if i is None else (i, None)

    def fits(self, eighths: int, reserved: frozenset[int]) -> bool:
        """Whether a request of ``eighths`` (whole slots: a multiple of 8) fits, avoiding
        ``reserved``."""
        if eighths < EIGHTHS_PER_SLOT:
            return self.fit_share(eighths, reserved) is not None
        return self.fit(eighths // EIGHTHS_PER_SLOT, reserved) is not None

    def reserve_share(self) -> frozenset[int]:
        """The agent a blocked share request will start on: the one with the most left
        (free slots and shared slots' room; ties: declared first)."""
        left = [
            (self.nfree[i] * EIGHTHS_PER_SLOT + self.room[i], -i)
            for i in range(len(self.agents))
            if self.size[i] > 0
        ]
        return frozenset({-max(left)[1]}) if left else frozenset()

    def left_on(self, agents: Iterable[int]) -> int:
        """Eighths left on ``agents``: their free slots and their shared slots' room."""
        return sum(self.nfree[i] * EIGHTHS_PER_SLOT + self.room[i] for i in agents)

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
