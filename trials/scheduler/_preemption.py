"""Preemption: which lower-priority running trials a blocked request asks to stop.

Determined's priority scheduler with preemption, for pools with ``preemption: true``:
when the blocked head of a decision (the first waiting request, in priority order, that
cannot start) still cannot start, running trials of strictly lower priority (a larger
``priority`` number) are asked to checkpoint and stop. They go back to the queue and
resume from that checkpoint. Pure and in memory like the core: the caller owns the
asking, the stopping and the bookkeeping.

Rules:

* Slots of trials already asked to stop (``stopping``) count as free: they will be soon.
  If the request fits with them, nothing more is preempted (``()``), so one blocked
  request never preempts twice for the same room while earlier victims are stopping.
* Victims are running, not stopping, of strictly lower priority than the request, and
  have reached their first checkpoint unless ``without_checkpoint`` (the pool's
  ``preempt_without_checkpoint``): stopping an un-checkpointed trial loses its progress.
* "Fits" is the scheduler core's own decision (:meth:`SlotScheduler.fits` on the free
  slots plus the victims' slots), so preemption frees exactly what the next
  :func:`~trials.scheduler.schedule` call needs; it never copies the fitting rules.
* Fewest victims first. Sets of the same size are compared victim by victim, most
  valuable first, and the set whose most valuable victim is least valuable wins (then
  the second most valuable, and so on). A trial is more valuable when its priority is
  higher (smaller number), then when it holds more slots (a share counts at its
  fraction), then when it started earlier
  (earlier in ``running``, which lists trials in start order). So the least important,
  smallest, most recently started trials go first.
* The result is irredundant: without any one victim the request would not fit. No more
  trials are preempted than the waiting one needs.

How victims are found, and what it costs (``R`` running trials, ``A`` agents, ``m`` the
most candidates on one agent, at most its slot count):

* A request of at most the largest agent's size starts on ONE agent, so a smallest set
  frees room on a single agent. For every agent large enough, the fewest victims on it
  follow from its candidates' slot counts there (largest first); then candidates are
  spared, most valuable first, while a set of that size still makes room without them.
  This is exact for the rules above. ``O(R + A * m^2)``.
* A larger request needs whole free agents, so every trial on a chosen agent must stop
  and trials spanning agents free several at once (a set-cover problem). Agents are
  chosen greedily by new victims per needed slot, fewest first: for each agent size the
  request is a multiple of, or over all agents with heterogeneous fits. ``O(A^2 * m)``.
  This greedy is not guaranteed to find the fewest victims, only a valid, irredundant set.
* A share of one slot (``request.share`` below 1) needs room on ONE slot: a free one,
  a shared slot whose shares leave room once some stop, or a slot a whole-slot trial
  holds (stopping it frees the whole slot). For every slot the fewest victims follow as
  on one agent, in eighths of the slot; exact for the rules above. Shares count at their
  fraction: a share trial frees its eighths of its slot, and a slot is free for a whole
  request only once every share on it has stopped.
* A whole-slot request is first searched among whole-slot trials only, as above; when
  no such set makes room (the slots it needs hold shares), every candidate is taken and
  cut down by the last step, which keeps the set valid and irredundant but not
  necessarily the fewest.
* Finally, victims are dropped, most valuable first, while the request still fits: one
  core check per victim, each ``O(S)`` for the pool's ``S`` slots.

A few hundred running trials on a few dozen agents take milliseconds.

Example (a1 is busy with two low-priority trials, a2 with one; the high-priority
2-slot request needs one agent, and a2 costs one victim instead of two):
    >>> from trials.scheduler import Agent, AgentSlots, Placement, ResourcePool, SlotRequest
    >>> a1, a2 = Agent("a1", "h", (0, 1)), Agent("a2", "h", (0, 1))
    >>> pool = ResourcePool("default", (a1, a2), preemption=True)
    >>> def running(name, agent, slots):
    ...     placement = Placement(name, "default", (AgentSlots(agent, slots),))
    ...     return RunningRequest(name, priority=50, placement=placement, checkpointed=True)
    >>> runs = [running("x", a1, (0,)), running("y", a1, (1,)), running("z", a2, (0, 1))]
    >>> choose_preemptions(pool, {}, runs, SlotRequest("urgent", 2, priority=1))
    ('z',)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from trials.config import EIGHTHS_PER_SLOT
from trials.scheduler._cluster import ResourcePool
from trials.scheduler._core import Placement, SlotRequest, SlotScheduler


@dataclass(frozen=True)
class RunningRequest:
    """A running trial as preemption sees it.

    ``checkpointed``: the trial has reached its first checkpoint, so stopping it loses
    little. ``stopping``: it was already asked to stop, so its slots count as freed soon.

    Example:
        >>> from trials.scheduler import Agent, AgentSlots, Placement
        >>> agent = Agent("a1", "h", (0, 1))
        >>> run = RunningRequest("t1", 42, Placement("t1", "default", (AgentSlots(agent, (0,)),)), True)
        >>> run.placement.slots, run.stopping
        (1, False)
    """

    request_id: Hashable
    priority: int
    placement: Placement
    checkpointed: bool
    stopping: bool = False


@dataclass(frozen=True)
class _Candidate:
    """A running trial that may be preempted, with what stopping it frees per agent."""

    run: RunningRequest
    #: Position in ``running`` (start order): a larger one started more recently.
    position: int
    #: 0 for the most valuable candidate (see the module's rules); victims are compared by it.
    rank: int
    #: Agent name -> how many of its currently used slots stopping this trial frees (a
    #: share frees none alone); for a share request, (agent, slot) -> eighths freed.
    frees: Mapping[Hashable, int]


def choose_preemptions(
    pool: ResourcePool,
    free_slots: Mapping[str, frozenset[int]],
    running: Sequence[RunningRequest],
    request: SlotRequest,
    *,
    without_checkpoint: bool = False,
    shared: Mapping[str, Mapping[int, int]] | None = None,
) -> tuple[Hashable, ...] | None:
    """The running trials to ask to stop so that ``request`` fits (see the module's rules).

    ``free_slots`` maps agent name to its free slot ids (a missing agent has none free)
    and ``shared`` the eighths shares use on each shared slot, as for
    :func:`~trials.scheduler.schedule`; ``running`` lists the pool's running
    trials in the order they started. Returns the victims' request ids in that order,
    ``()`` when the request already fits once the ``stopping`` trials are gone, and
    ``None`` when no eligible set of victims makes room. Raises ``ValueError`` for a
    running trial placed in another pool or on an agent the pool lacks, or listed twice.

    Whether the pool allows preemption at all (``pool.preemption``) is the caller's
    check; ``without_checkpoint`` is usually ``pool.preempt_without_checkpoint``.

    Example (only the low-priority trial on a1 may go; a2's trial outranks the request):
        >>> from trials.scheduler import Agent, AgentSlots, Placement, ResourcePool
        >>> a1, a2 = Agent("a1", "h", (0, 1)), Agent("a2", "h", (0, 1))
        >>> pool = ResourcePool("default", (a1, a2), preemption=True)
        >>> def on(agent, name, priority):
        ...     placement = Placement(name, "default", (AgentSlots(agent, (0, 1)),))
        ...     return RunningRequest(name, priority, placement, checkpointed=True)
        >>> runs = [on(a1, "low", 99), on(a2, "high", 1)]
        >>> choose_preemptions(pool, {}, runs, SlotRequest("mid", 2, priority=42))
        ('low',)
        >>> choose_preemptions(pool, {}, runs, SlotRequest("big", 4, priority=42)) is None
        True
    """
    _check_running(pool, running)
    names = {agent.name for agent in pool.agents}
    # Unknown agents in ``free_slots`` are the core's error to report, not silently dropped.
    base = {name: set(ids) for name, ids in free_slots.items()}
    for name in names:
        base.setdefault(name, set())
    used = {name: dict(slots) for name, slots in (shared or {}).items()}
    for run in running:
        if run.stopping:
            _add_slots(base, used, run.placement)
    room = _Room(pool, base, used, request)
    if room.fits(()):
        return ()
    eligible = [
        (position, run)
        for position, run in enumerate(running)
        if not run.stopping
        and run.priority > request.priority
        and (run.checkpointed or without_checkpoint)
    ]
    if not eligible:
        return None
    candidates = _candidates(eligible, base)
    if not room.fits(candidates):
        return None
    largest = max((agent.size for agent in pool.agents), default=0)
    whole = [c for c in candidates if c.run.placement.share == 1.0]
    chosen: list[_Candidate] | None
    if request.share < 1.0:
        chosen = _one_slot(used, candidates, request.eighths)
    elif request.slots <= largest:
        chosen = _one_agent(pool, base, whole, request.slots)
    else:
        chosen = _whole_agents(pool, base, whole, request.slots)
    if chosen is None or not room.fits(chosen):
        # Not expected (the search mirrors the core's shapes), but inconsistent inputs,
        # e.g. two trials claiming one slot, must not yield a set that does not fit.
        chosen = candidates
    chosen = _irredundant(room, chosen)
    return tuple(c.run.request_id for c in sorted(chosen, key=lambda c: c.position))


def _check_running(pool: ResourcePool, running: Sequence[RunningRequest]) -> None:
    names = {agent.name for agent in pool.agents}
    seen: set[Hashable] = set()
    for run in running:
        if run.request_id in seen:
            raise ValueError(f"running request {run.request_id!r} is listed twice")
        seen.add(run.request_id)
        if run.placement.pool != pool.name:
            raise ValueError(
                f"running request {run.request_id!r} is placed in resource pool "
                f"{run.placement.pool!r}, not {pool.name!r}"
            )
        for part in run.placement.agents:
            if part.agent.name not in names:
                raise ValueError(
                    f"running request {run.request_id!r} uses agent {part.agent.name!r}, "
                    f"which resource pool {pool.name!r} does not have"
                )


def _add_slots(
    free: dict[str, set[int]], shared: dict[str, dict[int, int]], placement: Placement
) -> None:
    """``placement``'s slots back: a whole slot is free; a share's eighths leave its slot,
    which is free once no share is left on it."""
    for part in placement.agents:
        if placement.share == 1.0:
            free[part.agent.name].update(part.slots)
            continue
        on_agent = shared.setdefault(part.agent.name, {})
        for slot in part.slots:
            left = on_agent.get(slot, 0) - placement.eighths
            if left > 0:
                on_agent[slot] = left
            else:
                on_agent.pop(slot, None)
                free[part.agent.name].add(slot)


def _candidates(
    eligible: Sequence[tuple[int, RunningRequest]], base: Mapping[str, set[int]]
) -> list[_Candidate]:
    """The eligible runs ranked most valuable first: higher priority, more slots, older."""
    ordered = sorted(
        eligible, key=lambda item: (item[1].priority, -item[1].placement.size, item[0])
    )
    candidates = []
    for rank, (position, run) in enumerate(ordered):
        frees: dict[Hashable, int] = {}
        # A share frees no whole slot on its own (see _one_slot for share requests).
        parts = run.placement.agents if run.placement.share == 1.0 else ()
        for part in parts:
            # Slots already counted free are not freed again (inconsistent input only).
            n = len(set(part.slots) - base[part.agent.name])
            if n:
                frees[part.agent.name] = frees.get(part.agent.name, 0) + n
        candidates.append(_Candidate(run, position, rank, frees))
    return candidates


def _set_key(victims: Iterable[_Candidate]) -> tuple[int, tuple[int, ...]]:
    """Smaller is better: fewer victims, then less valuable ones (see the module's rules)."""
    ranks = sorted(c.rank for c in victims)
    # The most valuable victim (smallest rank) should be as little valuable as possible.
    return len(ranks), tuple(-rank for rank in ranks)


class _Room:
    """Asks the scheduler core whether the request fits once given victims have stopped."""

    def __init__(
        self,
        pool: ResourcePool,
        base: Mapping[str, set[int]],
        shared: Mapping[str, Mapping[int, int]],
        request: SlotRequest,
    ) -> None:
        self._base = base
        self._shared = shared
        self._request = request
        self._scheduler = SlotScheduler(pool)

    def fits(self, victims: Iterable[_Candidate]) -> bool:
        free = {name: set(ids) for name, ids in self._base.items()}
        shared = {name: dict(slots) for name, slots in self._shared.items()}
        for victim in victims:
            _add_slots(free, shared, victim.run.placement)
        self._scheduler.set_free_slots(free, shared)
        return self._scheduler.fits(self._request.slots, share=self._request.share)


def _one_agent(
    pool: ResourcePool,
    base: Mapping[str, set[int]],
    candidates: Sequence[_Candidate],
    slots: int,
) -> list[_Candidate] | None:
    """The best set that frees ``slots`` on one agent: exact for the module's rules.

    A smallest set making any agent fit can be cut down to the victims on that agent,
    so the best over all agents, each with its own best set, is the best overall.
    """
    on_agent: dict[Hashable, list[_Candidate]] = {}
    for candidate in candidates:
        for name in candidate.frees:
            on_agent.setdefault(name, []).append(candidate)
    best: list[_Candidate] | None = None
    for agent in pool.agents:
        need = slots - len(base[agent.name])
        if agent.size < slots or agent.name not in on_agent:
            continue
        chosen = _fewest_on(agent.name, on_agent[agent.name], need)
        if chosen is not None and (best is None or _set_key(chosen) < _set_key(best)):
            best = chosen
    return best


def _one_slot(
    shared: Mapping[str, Mapping[int, int]], candidates: Sequence[_Candidate], eighths: int
) -> list[_Candidate] | None:
    """The best set that frees ``eighths`` of one slot for a share: exact for the rules.

    A slot a whole-slot trial holds is freed by stopping that trial; a shared slot by
    stopping shares on it until its room holds the request (fewest first, then the
    least valuable, as on one agent).
    """
    on_slot: dict[tuple[str, int], list[_Candidate]] = {}
    for candidate in candidates:
        for part in candidate.run.placement.agents:
            for slot in part.slots:
                on_slot.setdefault((part.agent.name, slot), []).append(candidate)
    best: list[_Candidate] | None = None
    for (name, slot), holders in on_slot.items():
        used = shared.get(name, {}).get(slot)
        if used is None:
            # Held whole, by one trial: stopping it frees the slot.
            chosen: list[_Candidate] | None = holders[:1]
        else:
            key = (name, slot)
            freeing = [
                replace(c, frees={key: c.run.placement.eighths})
                for c in holders
                if c.run.placement.share < 1.0
            ]
            chosen = _fewest_on(key, freeing, eighths - (EIGHTHS_PER_SLOT - used))
        if chosen is not None and (best is None or _set_key(chosen) < _set_key(best)):
            best = chosen
    return best


def _fewest_on(
    name: Hashable, candidates: Sequence[_Candidate], need: int
) -> list[_Candidate] | None:
    """The best smallest set of ``candidates`` freeing ``need`` slots on agent ``name``
    (or ``need`` eighths of one slot, ``name`` then being that slot)."""
    by_size = sorted(candidates, key=lambda c: (-c.frees[name], c.rank))
    count, covered = 0, 0
    for candidate in by_size:
        if covered >= need:
            break
        covered += candidate.frees[name]
        count += 1
    if covered < need:
        return None
    # Taking the largest first gives the fewest victims; now spare the most valuable
    # candidates one by one while ``count`` of the rest still free enough. (A set of at
    # most ``count`` exists among some candidates exactly when their ``count`` largest
    # do.) What is never spared is in every smallest set of what remains: the result.
    allowed = by_size
    for candidate in sorted(candidates, key=lambda c: c.rank):
        rest = [c for c in allowed if c is not candidate]
        if sum(c.frees[name] for c in rest[:count]) >= need:
            allowed = rest
    return allowed


def _whole_agents(
    pool: ResourcePool,
    base: Mapping[str, set[int]],
    candidates: Sequence[_Candidate],
    slots: int,
) -> list[_Candidate] | None:
    """A set that frees whole agents for a request larger than any one agent (greedy)."""
    holders: dict[Hashable, set[int]] = {}
    for i, candidate in enumerate(candidates):
        for name in candidate.frees:
            holders.setdefault(name, set()).add(i)
    # An agent can be freed only when candidates hold every slot in use on it.
    freeable: list[tuple[int, int, frozenset[int]]] = []
    for index, agent in enumerate(pool.agents):
        used = agent.size - len(base[agent.name])
        victims = holders.get(agent.name, set())
        if agent.size > 0 and sum(candidates[i].frees[agent.name] for i in victims) >= used:
            freeable.append((index, agent.size, frozenset(victims)))
    if pool.allowing_heterogeneous_fits:
        # Whole agents of any sizes that add up to the request.
        return _greedy_agents(freeable, candidates, slots)
    # ``slots // size`` whole agents of one size that divides the request; try each.
    best: list[_Candidate] | None = None
    for size in sorted({agent.size for agent in pool.agents if agent.size > 0}):
        if slots % size:
            continue
        chosen = _greedy_agents([f for f in freeable if f[1] == size], candidates, slots)
        if chosen is not None and (best is None or _set_key(chosen) < _set_key(best)):
            best = chosen
    return best


def _greedy_agents(
    freeable: Sequence[tuple[int, int, frozenset[int]]],
    candidates: Sequence[_Candidate],
    slots: int,
) -> list[_Candidate] | None:
    """Pick agents until their slots cover ``slots``, fewest new victims per needed slot first.

    Trials spanning several agents are counted once: an agent whose trials are already
    chosen costs nothing more (agents already free cost nothing either).
    """
    chosen: set[int] = set()
    remaining = slots
    left = list(freeable)
    while remaining > 0:
        if not left:
            return None
        pick = min(left, key=lambda option: _agent_cost(option, chosen, remaining, candidates))
        left.remove(pick)
        chosen |= pick[2]
        remaining -= pick[1]
    return [candidates[i] for i in sorted(chosen)]


def _agent_cost(
    option: tuple[int, int, frozenset[int]],
    chosen: set[int],
    remaining: int,
    candidates: Sequence[_Candidate],
) -> tuple[float, tuple[int, tuple[int, ...]], int]:
    """Smaller is better: new victims per slot still needed, then fewer and less valuable
    new victims, then the agent declared first."""
    index, size, victims = option
    new = victims - chosen
    # Slots beyond what is still needed are worth nothing to this request.
    return len(new) / min(size, remaining), _set_key(candidates[i] for i in new), index


def _irredundant(room: _Room, victims: Sequence[_Candidate]) -> list[_Candidate]:
    """Drop victims, most valuable first, while the request still fits without them.

    Fitting only gets easier with more free slots, so a victim kept once stays needed as
    others are dropped: one pass leaves a set from which no victim can be removed.
    """
    kept = sorted(victims, key=lambda c: c.rank)
    for victim in list(kept):
        rest = [c for c in kept if c is not victim]
        if room.fits(rest):
            kept = rest
    return kept
