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
* A share of one slot (``share`` 0.5, 0.25 or 0.125 of a one-slot request) packs: it
  goes to the shared slot with the least room that still holds it, and to a free slot
  (chosen as for a one-slot request) only when no shared slot has room, so free slots
  and whole agents stay free for whole-slot trials (``fitting_policy="worst"`` spreads
  instead: a free slot first). A share never spans slots; a slot holds shares or one
  whole-slot trial, never both; the shares on a slot add up to at most one slot.
  Shares are counted in eighths of a slot, exactly (:mod:`trials.config._shares`).
* Larger requests take whole FREE agents only: ``k`` agents of one size ``S`` with
  ``slots == k * S`` (the largest such ``S`` first, so as few machines as possible), or,
  with ``allowing_heterogeneous_fits``, free agents of any sizes, largest first, the last
  one possibly in part.
* Order: lower ``priority`` number first; among equal priorities, fair share between
  groups (experiments): the group holding the fewest slots per unit of weight
  (``held / weight``, see :meth:`SlotScheduler.set_share`; a share counts as its
  fraction of a slot) first, counting what the same
  pass has already placed, so groups take turns; on equal footing, the group served least
  recently first; then ``order`` (FIFO submission order).
  Requests without a ``group`` all belong to the group ``None``, so a queue without
  groups is ordered exactly by priority and then ``order``.
* Backfilling (EASY-style reservation): the first request in that order that cannot start
  (the *blocked head*) reserves the agents it is closest to fitting on: for a one-agent
  request the large-enough agent with the most free slots (for a share, the agent with
  the most left, shared slots' room included); for a multi-agent request the
  ``k`` agents of its size with the most free slots. Requests behind it may start now,
  but only on agents outside that reservation. Reserved agents therefore only drain, so
  the head starts once they are free: it is never starved by a stream of smaller
  requests. (The reservation is recomputed on every call; the sum of the reserved
  agents' free slots never decreases between calls and grows whenever a trial on them
  ends, so the head waits at most ``k * S`` trial lengths, and in practice one drain.)
  A request with a strictly lower priority number still goes first: that is what
  priority means. With ``backfill=False`` the pass stops at the blocked head (plain FIFO).

Cost per decision is independent of the queue length: waiting requests are grouped by
size (in eighths of a slot) and group (a request that cannot fit means no later request
of the same size can),
so a pass looks at one head per (size, group), and agents are indexed by their number of
free slots (:mod:`trials.scheduler._free_slots`).

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

from trials.config import (
    ALLOWED_SLOTS_PER_TRIAL,
    DEFAULT_PRIORITY,
    EIGHTHS_PER_SLOT,
    is_slot_share,
    slot_eighths,
)
from trials.scheduler._cluster import Agent, ResourcePool
from trials.scheduler._fitting import check_schedulable
from trials.scheduler._free_slots import FreeSlots
from trials.scheduler._wait_reasons import WaitReason, WaitReasons


@dataclass(frozen=True)
class SlotRequest:
    """A trial waiting for ``slots`` slots; lower ``priority`` runs first, then lower ``order``.

    ``group`` is the experiment the trial belongs to when several experiments share the
    pool: among equal priorities the group holding the fewest slots per unit of weight
    goes first (:meth:`SlotScheduler.set_share`). ``None`` is a group like any other.

    ``share`` below 1 asks for that share of ONE slot (0.5, 0.25 or 0.125; ``slots`` is
    then 1): several such requests run on one slot at once.

    Example:
        >>> SlotRequest("t", 1, share=0.25).eighths, SlotRequest("t", 2).size
        (2, 2.0)
    """

    request_id: Hashable
    slots: int
    priority: int = DEFAULT_PRIORITY
    order: int = 0
    group: Hashable | None = None
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.share != 1.0 and not (is_slot_share(self.share) and self.slots == 1):
            raise ValueError(
                f"request {self.request_id!r}: slots={self.slots} share={self.share:g}; "
                f"a request takes {ALLOWED_SLOTS_PER_TRIAL}"
            )

    @property
    def eighths(self) -> int:
        """Its size in eighths of a slot, the unit the scheduler adds up exactly."""
        return slot_eighths(self.share) if self.share != 1.0 else self.slots * EIGHTHS_PER_SLOT

    @property
    def size(self) -> float:
        """Its size in slots: ``slots`` times ``share`` (exact)."""
        return self.slots * self.share


@dataclass(frozen=True)
class AgentSlots:
    """The slot ids a placement uses on one agent."""

    agent: Agent
    slots: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where a request starts: one entry per agent; the first agent hosts the rendezvous.

    ``group`` is the request's, so that :meth:`SlotScheduler.release` can lower what the
    group holds. ``share`` below 1: the request's share of its one slot.
    """

    request_id: Hashable
    pool: str
    agents: tuple[AgentSlots, ...]
    group: Hashable | None = None
    share: float = 1.0

    @property
    def slots(self) -> int:
        """How many slots it spans (a share spans one)."""
        return sum(len(part.slots) for part in self.agents)

    @property
    def size(self) -> float:
        """What it holds in slots: ``slots`` times ``share`` (exact)."""
        return self.slots * self.share

    @property
    def eighths(self) -> int:
        """What it holds on each of its slots, in eighths (a whole slot: 8)."""
        return slot_eighths(self.share)


# A queued request in its (size, group) heap: (priority, order, seq, request_id). Sizes
# are in eighths of a slot.
_Entry = tuple[int, int, int, Hashable]
# A (size, group) heap's head in a pass: (priority, held / weight of the group when it was
# pushed, order, seq, size, group). ``seq`` is unique, so groups are never compared.
_Head = tuple[int, tuple[float, float], int, int, int, Hashable]


class SlotScheduler:
    """The scheduler's state for one pool: free slots per agent and the waiting requests.

    It owns the queue and the order of a pass; where the free slots are and what fits
    is kept by a :class:`~trials.scheduler._free_slots.FreeSlots`, and why a request
    waits is worked out by :class:`~trials.scheduler._wait_reasons.WaitReasons`.

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
        self,
        pool: ResourcePool,
        free_slots: Mapping[str, Iterable[int]] | None = None,
        shared: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        self.pool = pool
        # Where the slots are and what fits: bookkeeping of its own, whose attributes
        # and methods the pass reads directly.
        self._free = FreeSlots(pool)
        self._free.set(free_slots, shared)
        self._groups: dict[tuple[int, Hashable], list[_Entry]] = {}
        self._live: dict[Hashable, tuple[int, SlotRequest]] = {}
        self._seq = 0
        self._checked_sizes: set[int] = set()
        # Fair share: slots each group holds (set_share, plus placements, minus releases;
        # a share counts as its fraction, exactly), its weight, and the demand still
        # queued: slots per priority and group, and requests per priority.
        self._held: dict[Hashable, float] = {}
        self._weight: dict[Hashable, float] = {}
        # When each group last had a request placed (the caller's clock, then a counter
        # above it): among groups of equal held / weight, the least recently served
        # goes first, so groups that each hold nothing between trials take turns.
        self._served: dict[Hashable, float] = {}
        self._backlog: dict[Hashable, float] = {}
        self._served_top = 0.0
        self._queued_slots: dict[int, dict[Hashable, float]] = {}
        self._queued_count: dict[int, int] = {}
        self._last_priority: dict[Hashable, int] = {}
        # What :meth:`why_waiting` derives from the state, kept until the state changes.
        self._why = WaitReasons(
            self._free,
            held=self._held,
            weight=self._weight,
            backlog=self._backlog,
            queued_slots=self._queued_slots,
            queued_count=self._queued_count,
            last_priority=self._last_priority,
        )
        self._reserved_agents: frozenset[int] = frozenset()
        self._blocked = False
        self.reserved: tuple[str, ...] = ()
        """Agents held back for the blocked head request by the last :meth:`schedule`."""
        self.blocked_head: Hashable | None = None
        """The first request of the last :meth:`schedule` that could not start (``None``: none).

        The reservation in :attr:`reserved` is made for it (with backfilling)."""

    # -- free slots ---------------------------------------------------------------

    def set_free_slots(
        self,
        free_slots: Mapping[str, Iterable[int]] | None,
        shared: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        """Replace the free slots of every agent (``None``: all free; missing agent: none free)
        and the eighths shares use on each shared slot (:meth:`shared_slots`' shape)."""
        self._free.set(free_slots, shared)
        self._why.clear()

    def free_slots(self) -> dict[str, frozenset[int]]:
        """Each agent's free slot ids now."""
        return self._free.by_agent()

    def shared_slots(self) -> dict[str, dict[int, int]]:
        """The eighths shares use on each shared slot now, by agent (agents with some only)."""
        return self._free.shared_by_agent()

    @property
    def free_total(self) -> int:
        return self._free.free_total

    @property
    def used_total(self) -> int:
        return self._free.total - self._free.free_total

    def fits(self, slots: int, *, share: float = 1.0) -> bool:
        """Whether a request of ``slots`` (at ``share``) would fit now, ignoring any reservation.

        Preemption (:func:`~trials.scheduler.choose_preemptions`) asks this of hypothetical
        free slots, so it and the scheduler never disagree on what fits.

        Example:
            >>> from trials.scheduler import Agent, ResourcePool
            >>> sched = SlotScheduler(ResourcePool("default", (Agent("a1", "h", (0, 1)),)))
            >>> sched.fits(2), sched.fits(3), sched.fits(1, share=0.5)
            (True, False, True)
        """
        return self._free.fits(SlotRequest(None, slots, share=share).eighths, frozenset())

    def release(self, placement: Placement) -> None:
        """Give a finished (or failed-to-start) placement's slots back."""
        free = self._free
        for part in placement.agents:
            if placement.share < 1.0:
                for slot in part.slots:
                    free.give_back_share(part.agent.name, slot, placement.eighths)
            else:
                free.give_back(part.agent.name, part.slots)
        held = self._held.get(placement.group)
        if held is not None:
            # ``set_share`` may have been told a smaller figure since the placement.
            self._held[placement.group] = max(0.0, held - placement.size)
        self._why.clear()

    # -- fair share ---------------------------------------------------------------

    def set_share(
        self,
        group: Hashable,
        *,
        held: float,
        weight: float = 1.0,
        last_served: float | None = None,
        backlog: float = 0,
    ) -> None:
        """Tell the slots ``group`` already holds in this pool and its fair-share weight.

        ``held`` counts the slots of the group's running trials (a share trial at its
        share: 0.25 for a quarter of a slot); ``weight`` is the
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
        self._why.clear()

    def _share_key(self, group: Hashable, fair: bool) -> tuple[float, float]:
        """Where ``group`` stands in fair share: (held / weight, last served)."""
        if not fair:
            return (0.0, 0.0)
        return (
            self._held.get(group, 0) / self._weight.get(group, 1.0),
            self._served.get(group, -math.inf),
        )

    def held_by(self, group: Hashable) -> float:
        """Slots ``group`` holds: as last :meth:`set_share`, plus placements, minus releases."""
        return self._held.get(group, 0)

    # -- queue --------------------------------------------------------------------

    def submit(self, request: SlotRequest) -> None:
        """Queue a request; :class:`Unschedulable` if the pool could never run it."""
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id!r} is already queued")
        # A share of a slot fits wherever one slot does.
        if request.slots not in self._checked_sizes:
            check_schedulable(self.pool, request.slots)
            self._checked_sizes.add(request.slots)
        seq = self._seq
        self._seq += 1
        self._live[request.request_id] = (seq, request)
        heap = self._groups.setdefault((request.eighths, request.group), [])
        heapq.heappush(heap, (request.priority, request.order, seq, request.request_id))
        by_group = self._queued_slots.setdefault(request.priority, {})
        by_group[request.group] = by_group.get(request.group, 0) + request.size
        self._queued_count[request.priority] = self._queued_count.get(request.priority, 0) + 1
        self._last_priority[request.group] = request.priority
        self._why.clear()

    def cancel(self, request_id: Hashable) -> bool:
        """Drop a queued request; False if it was not queued. (Heaps skip it lazily.)"""
        live = self._live.pop(request_id, None)
        if live is None:
            return False
        self._dequeued(live[1])
        self._why.clear()
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
        slots = by_group[group] - request.size
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
        self._why.clear()
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
        free = self._free
        fit_slots, take, agents = free.fit, free.take, free.agents
        # What is left, in eighths of a slot; ``size`` is too (a whole slot is 8).
        available = free.free_eighths
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
            whole = size >= EIGHTHS_PER_SLOT
            fit = fit_slots(size // EIGHTHS_PER_SLOT, reserved) if whole else None
            spot = free.fit_share(size, reserved) if not whole else None
            if fit is None and spot is None:
                failed.add(size)
                if self._blocked:
                    continue
                self._blocked = True
                self.blocked_head = self._groups[key][0][3]
                if not backfill:
                    break
                reserved = (
                    free.reserve(size // EIGHTHS_PER_SLOT) if whole else free.reserve_share()
                )
                available -= free.left_on(reserved)
                continue
            _, _, _, request_id = heapq.heappop(self._groups[key])
            _, request = self._live.pop(request_id)
            self._dequeued(request)
            held[group] = held.get(group, 0) + request.size
            self._served_top += 1.0
            self._served[group] = self._served_top
            parts: tuple[AgentSlots, ...]
            if spot is not None:
                parts = (AgentSlots(agents[spot[0]], (free.take_share(*spot, size),)),)
            else:
                parts = tuple(AgentSlots(agents[i], take(i, n)) for i, n in fit or ())
            placements.append(
                Placement(request_id, self.pool.name, parts, group, share=request.share)
            )
            available -= size
            entry = self._peek(key)
            if entry is not None:
                key_now = self._share_key(group, fair)
                heapq.heappush(heads, (entry[0], key_now, entry[1], entry[2], size, group))
        self._reserved_agents = reserved
        self.reserved = tuple(agents[i].name for i in sorted(reserved))
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
            return self._why.no_fit(request.eighths)
        return self._why.reason(
            request.eighths,
            request.group,
            request.priority,
            head=self.blocked_head,
            reserved=self._reserved_agents,
            label=label,
            group_label=group_label,
        )


def schedule(
    pool: ResourcePool,
    free_slots: Mapping[str, frozenset[int]],
    queue: Sequence[SlotRequest],
    *,
    backfill: bool = True,
    shared: Mapping[str, Mapping[int, int]] | None = None,
) -> list[Placement]:
    """The placements to start now for ``queue`` on ``pool`` (see the module's rules).

    ``free_slots`` maps agent name to its free slot ids (a missing agent has none free);
    ``shared`` the eighths shares use on each shared slot, by agent.
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
    scheduler = SlotScheduler(pool, free_slots, shared)
    for request in queue:
        scheduler.submit(request)
    return scheduler.schedule(backfill=backfill)
