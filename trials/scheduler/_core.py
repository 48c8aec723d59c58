"""The scheduler core: which waiting trials start now, and on which agents and slots.

Pure and in memory: a function of (pool, free slots, queue) with no I/O, so it is tested
exhaustively and benchmarked at cluster scale (``bench/scheduler_sim.py``). Slot
ownership across drivers lives in the database (:mod:`trials.coordination.allocations`).

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
* Order: lower ``priority`` number first; among equal priorities, fair share between
  groups (experiments): the group holding the fewest slots per unit of weight
  (``held / weight``, see :meth:`SlotScheduler.set_share`) first, counting what the same
  pass has already placed, so groups take turns; on equal footing, the group served least
  recently first; then ``order`` (FIFO submission order).
  Requests without a ``group`` all belong to the group ``None``, so a queue without
  groups is ordered exactly by priority and then ``order``.
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
size and group (a request that cannot fit means no later request of the same size can),
so a pass looks at one head per (size, group), and agents are indexed by their number of
free slots.

After a pass, :meth:`SlotScheduler.why_waiting` says why a request still waits
(:class:`WaitReason`: no fit, agents reserved for the blocked head, a higher priority
queued, or its experiment already holding its fair share).

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
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from trials.config import DEFAULT_PRIORITY
from trials.scheduler._cluster import Agent, ResourcePool
from trials.scheduler._fitting import check_schedulable, size_counts


@dataclass(frozen=True)
class SlotRequest:
    """A trial waiting for ``slots`` slots; lower ``priority`` runs first, then lower ``order``.

    ``group`` is the experiment the trial belongs to when several experiments share the
    pool: among equal priorities the group holding the fewest slots per unit of weight
    goes first (:meth:`SlotScheduler.set_share`). ``None`` is a group like any other.
    """

    request_id: Hashable
    slots: int
    priority: int = DEFAULT_PRIORITY
    order: int = 0
    group: Hashable | None = None


@dataclass(frozen=True)
class AgentSlots:
    """The slot ids a placement uses on one agent."""

    agent: Agent
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where a request starts: one entry per agent; the first agent hosts the rendezvous.

    ``group`` is the request's, so that :meth:`SlotScheduler.release` can lower what the
    group holds.
    """

    request_id: Hashable
    pool: str
    agents: tuple[AgentSlots, ...]
    group: Hashable | None = None

    @property
    def slots(self) -> int:
        return sum(len(part.slots) for part in self.agents)


WaitKind = Literal["no_fit", "reserved", "priority", "fair_share"]


@dataclass(frozen=True)
class WaitReason:
    """Why a request is still queued after a :meth:`SlotScheduler.schedule` pass.

    ``kind`` is for code (a badge, a metric label); ``text`` is one line for people.
    ``blocked_by`` is the request the free slots are held back for (kind ``"reserved"``).

    Example:
        >>> WaitReason("priority", "behind priority 1 trials")
        WaitReason(kind='priority', text='behind priority 1 trials', blocked_by=None)
    """

    kind: WaitKind
    text: str
    blocked_by: Hashable | None = None


# A queued request in its (size, group) heap: (priority, order, seq, request_id).
_Entry = tuple[int, int, int, Hashable]
# A (size, group) heap's head in a pass: (priority, held / weight of the group when it was
# pushed, order, seq, size, group). ``seq`` is unique, so groups are never compared.
_Head = tuple[int, tuple[float, float], int, int, int, Hashable]
# The label functions a cached reason was formatted with, and the reason.
_CachedReason = tuple[Callable[[Hashable], str], Callable[[Hashable], str], WaitReason]


def _water_fill(
    capacity: float, demand: Mapping[Hashable, float], weight: Mapping[Hashable, float]
) -> dict[Hashable, float]:
    """Weighted max-min fair shares of ``capacity``: ``weight * level`` each, capped by demand.

    Groups asking for less than their weighted part keep what they ask for, and what they
    leave is split among the others in proportion to their weights (water-filling).

    Example:
        >>> _water_fill(10, {"a": 2, "b": 20, "c": 20}, {"a": 1, "b": 1, "c": 3})
        {'a': 2, 'b': 2.0, 'c': 6.0}
    """
    shares: dict[Hashable, float] = {}
    left = float(capacity)
    weight_left = sum(weight[group] for group in demand)
    for group in sorted(demand, key=lambda g: demand[g] / weight[g]):
        share = min(demand[group], left * weight[group] / weight_left)
        shares[group] = share
        left -= share
        weight_left -= weight[group]
    return {group: shares[group] for group in demand}


class SlotScheduler:
    """The scheduler's state for one pool: free slots per agent and the waiting requests.

    :func:`schedule` builds one per call; a long-lived caller (the simulation, a driver
    that keeps its queue) keeps one and updates it with :meth:`submit`, :meth:`cancel`,
    :meth:`release` and :meth:`set_free_slots`, so a decision costs no more than the
    placements it makes. When several experiments share the pool, each request carries
    its experiment as ``group`` and :meth:`set_share` tells what each already holds.

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
        # What :meth:`why_waiting` derived from the state since the last change: reasons
        # per (slots, group, priority) and fair shares per priority.
        self._reasons: dict[tuple[int, Hashable, int], _CachedReason] = {}
        self._shares: dict[int, dict[Hashable, float]] = {}
        self.set_free_slots(free_slots)
        self._groups: dict[tuple[int, Hashable], list[_Entry]] = {}
        self._live: dict[Hashable, tuple[int, SlotRequest]] = {}
        self._seq = 0
        self._checked_sizes: set[int] = set()
        # Fair share: slots each group holds (set_share, plus placements, minus releases),
        # its weight, and the demand still queued: slots per priority and group, and
        # requests per priority.
        self._held: dict[Hashable, int] = {}
        self._weight: dict[Hashable, float] = {}
        # When each group last had a request placed (the caller's clock, then a counter
        # above it): among groups of equal held / weight, the least recently served
        # goes first, so groups that each hold nothing between trials take turns.
        self._served: dict[Hashable, float] = {}
        self._backlog: dict[Hashable, int] = {}
        self._served_top = 0.0
        self._queued_slots: dict[int, dict[Hashable, int]] = {}
        self._queued_count: dict[int, int] = {}
        self._last_priority: dict[Hashable, int] = {}
        self._reserved_agents: frozenset[int] = frozenset()
        self._blocked = False
        self.reserved: tuple[str, ...] = ()
        """Agents held back for the blocked head request by the last :meth:`schedule`."""
        self.blocked_head: Hashable | None = None
        """The first request of the last :meth:`schedule` that could not start (``None``: none).

        The reservation in :attr:`reserved` is made for it (with backfilling)."""

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
        self._invalidate()
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
        held = self._held.get(placement.group)
        if held is not None:
            # ``set_share`` may have been told a smaller figure since the placement.
            self._held[placement.group] = max(0, held - placement.slots)
        self._invalidate()

    # -- fair share ---------------------------------------------------------------

    def set_share(
        self,
        group: Hashable,
        *,
        held: int,
        weight: float = 1.0,
        last_served: float | None = None,
        backlog: int = 0,
    ) -> None:
        """Tell the slots ``group`` already holds in this pool and its fair-share weight.

        ``held`` counts the slots of the group's running trials; ``weight`` is the
        experiment's ``resources.weight``. Among requests of equal priority the group
        with the lowest ``held / weight`` starts first, so while several groups have work
        queued their holdings grow in proportion to their weights. Placements add to
        ``held`` and :meth:`release` subtracts, so a long-lived scheduler keeps it up to
        date itself. A group never named here holds 0 slots with weight 1.

        ``last_served`` (any increasing clock, e.g. the time of the group's latest
        trial start) breaks ties of ``held / weight``: the group served least recently
        goes first, so two experiments whose trials each take the whole pool alternate
        instead of the older one always winning. Never served: first.

        ``backlog`` counts slots the group has queued beyond the requests submitted
        here (a caller that submits only the requests a decision could reach): its
        demand, and so its fair share in :meth:`why_waiting`, includes them.

        Example (b already holds 2 slots, so a's request goes first):
            >>> from trials.scheduler import Agent, ResourcePool
            >>> sched = SlotScheduler(ResourcePool("default", (Agent("a1", "h", (0, 1)),)))
            >>> sched.set_share("b", held=2, weight=1.0)
            >>> sched.submit(SlotRequest("b1", 1, group="b"))
            >>> sched.submit(SlotRequest("a1", 1, order=1, group="a"))
            >>> [p.request_id for p in sched.schedule()]
            ['a1', 'b1']
        """
        if held < 0:
            raise ValueError(f"group {group!r}: held must be >= 0, not {held}")
        if not 0 < weight < math.inf:
            raise ValueError(f"group {group!r}: weight must be > 0 and finite, not {weight}")
        self._held[group] = held
        self._weight[group] = weight
        self._backlog[group] = backlog
        if last_served is not None:
            self._served[group] = last_served
            self._served_top = max(self._served_top, last_served)
        self._invalidate()

    def _share_key(self, group: Hashable, fair: bool) -> tuple[float, float]:
        """Where ``group`` stands in fair share: (held / weight, last served)."""
        if not fair:
            return (0.0, 0.0)
        return (
            self._held.get(group, 0) / self._weight.get(group, 1.0),
            self._served.get(group, -math.inf),
        )

    def held_by(self, group: Hashable) -> int:
        """Slots ``group`` holds: as last :meth:`set_share`, plus placements, minus releases."""
        return self._held.get(group, 0)

    def _invalidate(self) -> None:
        self._reasons.clear()
        self._shares.clear()

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
        heap = self._groups.setdefault((request.slots, request.group), [])
        heapq.heappush(heap, (request.priority, request.order, seq, request.request_id))
        by_group = self._queued_slots.setdefault(request.priority, {})
        by_group[request.group] = by_group.get(request.group, 0) + request.slots
        self._queued_count[request.priority] = self._queued_count.get(request.priority, 0) + 1
        self._last_priority[request.group] = request.priority
        self._invalidate()

    def cancel(self, request_id: Hashable) -> bool:
        """Drop a queued request; False if it was not queued. (Heaps skip it lazily.)"""
        live = self._live.pop(request_id, None)
        if live is None:
            return False
        self._dequeued(live[1])
        self._invalidate()
        return True

    def _dequeued(self, request: SlotRequest) -> None:
        """Take a request that left the queue out of the demand counts."""
        priority, group = request.priority, request.group
        count = self._queued_count[priority] - 1
        if count:
            self._queued_count[priority] = count
        else:
            del self._queued_count[priority]
        by_group = self._queued_slots[priority]
        slots = by_group[group] - request.slots
        if slots:
            by_group[group] = slots
        else:
            del by_group[group]
            if not by_group:
                del self._queued_slots[priority]

    @property
    def queued(self) -> int:
        return len(self._live)

    def _peek(self, key: tuple[int, Hashable]) -> _Entry | None:
        heap = self._groups[key]
        while heap:
            entry = heap[0]
            live = self._live.get(entry[3])
            if live is not None and live[0] == entry[2]:
                return entry
            heapq.heappop(heap)
        return None

    # -- decisions ----------------------------------------------------------------

    def schedule(self, *, backfill: bool = True) -> list[Placement]:
        """Start what can start now; the placements' slots count as used from here on.

        Also sets :attr:`reserved` and :attr:`blocked_head`, and adds each placement's
        slots to what its group holds.
        """
        self._invalidate()
        firsts: list[tuple[tuple[int, Hashable], _Entry]] = []
        drained: list[tuple[int, Hashable]] = []
        for key in self._groups:
            entry = self._peek(key)
            if entry is None:
                drained.append(key)
            else:
                firsts.append((key, entry))
        for key in drained:  # finished experiments leave no heaps behind
            del self._groups[key]
        held = self._held
        # With a single group, fair share changes nothing: every ratio stays 0.
        fair = len({key[1] for key, _ in firsts}) > 1
        heads: list[_Head] = [
            (
                entry[0],
                self._share_key(key[1], fair),
                entry[1],
                entry[2],
                key[0],
                key[1],
            )
            for key, entry in firsts
        ]
        heapq.heapify(heads)
        placements: list[Placement] = []
        reserved: frozenset[int] = frozenset()
        failed: set[int] = set()
        self._blocked = False
        self.blocked_head = None
        available = self._free_total
        while heads and available > 0:
            head = heapq.heappop(heads)
            priority, share, order, seq, size, group = head
            if size in failed:
                # Capacity only shrinks during a pass, so no later request of a size that
                # did not fit fits either, whatever its group: skipped until the next call.
                continue
            if fair:
                # A group's share key only grows during a pass, so a stored one is a
                # lower bound: a head whose key is current is truly the next in order.
                now = self._share_key(group, fair)
                if now != share:
                    heapq.heappush(heads, (priority, now, order, seq, size, group))
                    continue
            key = (size, group)
            fit = self._fit(size, reserved)
            if fit is None:
                failed.add(size)
                if self._blocked:
                    continue
                self._blocked = True
                self.blocked_head = self._groups[key][0][3]
                if not backfill:
                    break
                reserved = self._reserve(size)
                available -= sum(self._nfree[i] for i in reserved)
                continue
            _, _, _, request_id = heapq.heappop(self._groups[key])
            _, request = self._live.pop(request_id)
            self._dequeued(request)
            held[group] = held.get(group, 0) + size
            self._served_top += 1.0
            self._served[group] = self._served_top
            parts = tuple(AgentSlots(self._agents[i], self._take(i, n)) for i, n in fit)
            placements.append(Placement(request_id, self.pool.name, parts, group))
            available -= size
            entry = self._peek(key)
            if entry is not None:
                key_now = self._share_key(group, fair)
                heapq.heappush(heads, (entry[0], key_now, entry[1], entry[2], size, group))
        self._reserved_agents = reserved
        self.reserved = tuple(self._agents[i].name for i in sorted(reserved))
        return placements

    # -- wait reasons -------------------------------------------------------------

    def why_waiting(
        self,
        request_id: Hashable,
        *,
        label: Callable[[Hashable], str] = str,
        group_label: Callable[[Hashable], str] = str,
    ) -> WaitReason:
        """Why a request is still queued after the last :meth:`schedule`.

        Raises ``KeyError`` for a request that is not queued. The reason is the first of
        these that applies, against the free slots now:

        * ``"no_fit"`` for the blocked head (the request :attr:`reserved` is for);
        * ``"reserved"`` if it would fit but for the agents reserved for the blocked head;
        * ``"priority"`` if a request with a lower priority number is queued;
        * ``"fair_share"`` if its group holds at least its fair share (weighted max-min
          of the pool's slots among the groups of its priority, each capped by its
          demand: slots held plus queued) while another group of that priority waits;
        * ``"no_fit"`` otherwise: not enough free slots of the shape it needs.

        ``label`` names a request (the blocked head) and ``group_label`` a group in the
        text. Requests of one size, group and priority share their reason, so asking for
        every queued request costs little more than a dict lookup each (pass the same
        label functions to reuse the formatted text).

        Example:
            >>> from trials.scheduler import Agent, ResourcePool
            >>> sched = SlotScheduler(ResourcePool("p", (Agent("a1", "h", (0, 1)),)))
            >>> sched.submit(SlotRequest("t1", 2)); sched.submit(SlotRequest("t2", 1, order=1))
            >>> [p.request_id for p in sched.schedule()]
            ['t1']
            >>> sched.why_waiting("t2")
            WaitReason(kind='no_fit', text='no agent in pool p has 1 free slot', blocked_by=None)
        """
        live = self._live.get(request_id)
        if live is None:
            raise KeyError(request_id)
        request = live[1]
        if self._blocked and request_id == self.blocked_head:
            return WaitReason("no_fit", self._no_fit_text(request.slots))
        key = (request.slots, request.group, request.priority)
        cached = self._reasons.get(key)
        if cached is not None and cached[0] is label and cached[1] is group_label:
            return cached[2]
        reason = self._reason(request, label, group_label)
        self._reasons[key] = (label, group_label, reason)
        return reason

    def _reason(
        self,
        request: SlotRequest,
        label: Callable[[Hashable], str],
        group_label: Callable[[Hashable], str],
    ) -> WaitReason:
        slots, group, priority = request.slots, request.group, request.priority
        reserved = self._reserved_agents
        if (
            reserved
            and self._fit(slots, reserved) is None
            and self._fit(slots, frozenset()) is not None
        ):
            head = self.blocked_head
            return WaitReason(
                "reserved",
                f"agents {', '.join(self.reserved)} reserved for trial {label(head)} "
                "by backfilling",
                blocked_by=head,
            )
        lowest = min(self._queued_count)
        if lowest < priority:
            return WaitReason("priority", f"behind priority {lowest} trials")
        if len(self._queued_slots[priority]) > 1:
            share = self._fair_shares(priority)[group]
            held = self._held.get(group, 0)
            # A share computed in floats may miss an integer holding by a rounding error.
            if held >= share - 1e-9:
                return WaitReason(
                    "fair_share",
                    f"fair share: experiment {group_label(group)} holds its share "
                    f"({held} of {round(share, 1):g} slots)",
                )
        return WaitReason("no_fit", self._no_fit_text(slots))

    def _fair_shares(self, priority: int) -> dict[Hashable, float]:
        """Each group's weighted max-min share of the pool at ``priority`` (cached)."""
        shares = self._shares.get(priority)
        if shares is not None:
            return shares
        held, weight = self._held, self._weight
        demand = {
            group: held.get(group, 0) + slots + self._backlog.get(group, 0)
            for group, slots in self._queued_slots.get(priority, {}).items()
        }
        # A group with nothing queued still takes part with what it holds, at the
        # priority of the last request it submitted here.
        for group, slots in held.items():
            if slots and group not in demand and self._last_priority.get(group) == priority:
                demand[group] = slots
        shares = _water_fill(self._total, demand, {g: weight.get(g, 1.0) for g in demand})
        self._shares[priority] = shares
        return shares

    def _no_fit_text(self, slots: int) -> str:
        pool = self.pool.name
        if slots <= self._max:
            return f"no agent in pool {pool} has {_count(slots, 'free slot')}"
        if self._hetero:
            return f"pool {pool} has fewer than {_count(slots, 'slot')} on whole free agents"
        size = self._agent_size_for(slots)
        return (
            f"pool {pool} has fewer than {_count(slots // size, 'free agent')} "
            f"of {_count(size, 'slot')}"
        )

    def _agent_size_for(self, slots: int) -> int:
        """The agent size a multi-agent request takes whole agents of (the largest that can)."""
        return next(
            s for s in self._sizes_desc if slots % s == 0 and slots // s <= self._counts[s]
        )

    def fits(self, slots: int) -> bool:
        """Whether a request of ``slots`` would fit the free slots now, ignoring any reservation.

        Preemption (:func:`~trials.scheduler.choose_preemptions`) asks this of hypothetical
        free slots, so it and the scheduler never disagree on what fits.

        Example:
            >>> from trials.scheduler import Agent, ResourcePool
            >>> sched = SlotScheduler(ResourcePool("default", (Agent("a1", "h", (0, 1)),)))
            >>> sched.fits(2), sched.fits(3)
            (True, False)
        """
        return self._fit(slots, frozenset()) is not None

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
            wanted = self._agent_size_for(slots)
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


def _count(n: int, noun: str) -> str:
    """``1 free slot``, ``2 free slots``: reasons read as words."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
