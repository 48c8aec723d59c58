"""Shares of one slot in the scheduler core: packing, counting, fair share, backfill, preemption."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trials.scheduler.conftest import all_free, free_counts, make_pool
from trials.config import EIGHTHS_PER_SLOT, SLOT_SHARES
from trials.scheduler import (
    AgentSlots,
    Placement,
    ResourcePool,
    RunningRequest,
    SlotRequest,
    SlotScheduler,
    choose_preemptions,
    schedule,
)


def where(placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
    return [(part.agent.name, part.slots) for part in placement.agents]


def share(request_id: object, fraction: float, **kwargs: object) -> SlotRequest:
    return SlotRequest(request_id, 1, share=fraction, **kwargs)  # type: ignore[arg-type]


# -- the values ----------------------------------------------------------------------


def test_the_allowed_shares_add_up_exactly() -> None:
    """Powers of two: sums of shares never round, so "at most one slot" is exact."""
    assert 0.5 + 0.25 + 0.125 + 0.125 == 1.0
    assert sum([0.125] * 8) == 1.0
    assert [share("t", s).eighths for s in SLOT_SHARES] == [4, 2, 1]
    assert SlotRequest("t", 3).eighths == 3 * EIGHTHS_PER_SLOT


@pytest.mark.parametrize(("slots", "fraction"), [(1, 0.3), (2, 0.5), (1, 0.75), (1, 0.0625)])
def test_other_shares_are_refused(slots: int, fraction: float) -> None:
    with pytest.raises(ValueError, match=r"0\.5, 0\.25 or 0\.125"):
        SlotRequest("t", slots, share=fraction)


# -- packing -------------------------------------------------------------------------


def test_a_share_goes_to_a_partly_used_slot_before_an_empty_one() -> None:
    pool = make_pool([2, 2])
    # a0 slot 0 holds a quarter; a1 is wholly free.
    scheduler = SlotScheduler(pool, {"a0": {1}, "a1": {0, 1}}, shared={"a0": {0: 2}})
    scheduler.submit(share("q", 0.25))
    [placed] = scheduler.schedule()
    assert where(placed) == [("a0", (0,))]
    assert placed.share == 0.25 and placed.size == 0.25
    assert scheduler.shared_slots() == {"a0": {0: 4}}


def test_the_fullest_shared_slot_that_holds_the_share_wins() -> None:
    pool = make_pool([2, 2])
    shared = {"a0": {0: 2}, "a1": {1: 6}}  # a0/0 has 6 eighths left, a1/1 has 2
    [quarter] = schedule(pool, {"a0": frozenset({1})}, [share("q", 0.25)], shared=shared)
    assert where(quarter) == [("a1", (1,))]
    # Half a slot does not fit in a1/1's quarter: a0/0, not a free slot.
    [half] = schedule(pool, {"a0": frozenset({1})}, [share("h", 0.5)], shared=shared)
    assert where(half) == [("a0", (0,))]


def test_with_no_room_on_shared_slots_a_share_takes_a_free_slot_as_a_one_slot_trial_would() -> (
    None
):
    pool = make_pool([4, 4])
    # Best fit: a1 (2 free) before a0 (4 free), as for a one-slot request.
    [placed] = schedule(pool, free_counts(pool, [4, 2]), [share("h", 0.5)])
    assert where(placed) == [("a1", (2,))]


def test_worst_fit_spreads_shares_over_free_slots_first() -> None:
    pool = make_pool([2, 2], policy="worst")
    placed = schedule(pool, all_free(pool), [share(i, 0.25, order=i) for i in range(3)])
    assert [where(p) for p in placed] == [[("a0", (0,))], [("a1", (0,))], [("a0", (1,))]]


def test_two_halves_fill_one_slot_and_a_third_waits() -> None:
    pool = make_pool([1])
    scheduler = SlotScheduler(pool)
    for i in range(3):
        scheduler.submit(share(i, 0.5, order=i))
    placed = scheduler.schedule()
    assert [(p.request_id, where(p)) for p in placed] == [(0, [("a0", (0,))]), (1, [("a0", (0,))])]
    assert scheduler.queued == 1
    assert scheduler.why_waiting(2).text == "no slot in pool default has 1/2 of a slot free"
    scheduler.release(placed[0])
    [third] = scheduler.schedule()
    assert third.request_id == 2 and where(third) == [("a0", (0,))]


def test_eight_eighths_fill_a_slot() -> None:
    pool = make_pool([1])
    placed = schedule(pool, all_free(pool), [share(i, 0.125, order=i) for i in range(9)])
    assert len(placed) == 8
    assert {where(p)[0] for p in placed} == {("a0", (0,))}


def test_a_share_and_a_whole_trial_never_share_a_slot() -> None:
    pool = make_pool([2])
    scheduler = SlotScheduler(pool)
    scheduler.submit(share("s", 0.25))
    scheduler.submit(SlotRequest("w", 1, order=1))
    scheduler.submit(SlotRequest("w2", 1, order=2))
    placed = {p.request_id: where(p) for p in scheduler.schedule()}
    # The share took slot 0; one whole trial gets slot 1; the other cannot use slot 0's room.
    assert placed == {"s": [("a0", (0,))], "w": [("a0", (1,))]}
    assert scheduler.queued == 1
    # And no share goes onto a slot a whole trial holds.
    assert schedule(pool, {"a0": frozenset()}, [share("s2", 0.125)]) == []


def test_the_last_share_to_leave_frees_the_slot_for_whole_trials() -> None:
    pool = make_pool([1])
    scheduler = SlotScheduler(pool)
    scheduler.submit(share("a", 0.5))
    scheduler.submit(share("b", 0.25, order=1))
    a, b = scheduler.schedule()
    scheduler.submit(SlotRequest("w", 1, order=2))
    scheduler.release(a)
    assert scheduler.schedule() == [] and scheduler.free_total == 0
    scheduler.release(b)
    [whole] = scheduler.schedule()
    assert whole.request_id == "w" and scheduler.shared_slots() == {}


def test_whole_agents_with_a_shared_slot_are_not_whole() -> None:
    pool = make_pool([2, 2])
    placed = schedule(
        pool,
        {"a0": frozenset({1}), "a1": frozenset({0, 1})},
        [SlotRequest("big", 4)],
        shared={"a0": {0: 1}},
    )
    assert placed == []


def test_an_impossible_release_is_refused() -> None:
    pool = make_pool([1])
    scheduler = SlotScheduler(pool)
    ghost = Placement("g", "default", (AgentSlots(pool.agents[0], (0,)),), share=0.5)
    with pytest.raises(ValueError, match="holds no share"):
        scheduler.release(ghost)


# -- order: priority, fair share, backfill ---------------------------------------------


def test_priority_goes_first_among_shares() -> None:
    pool = make_pool([1])
    placed = schedule(
        pool,
        all_free(pool),
        [
            share("low", 0.5, priority=50),
            share("high", 0.5, priority=1, order=1),
            share("mid", 0.5, priority=10, order=2),
        ],
    )
    assert [p.request_id for p in placed] == ["high", "mid"]


def test_fair_share_counts_a_share_at_its_fraction() -> None:
    pool = make_pool([2])
    scheduler = SlotScheduler(pool)
    # a holds half a slot, b a whole one: a's next trial goes first.
    scheduler.set_share("a", held=0.5)
    scheduler.set_share("b", held=1)
    scheduler.set_free_slots({"a0": {1}}, {"a0": {0: 4}})
    scheduler.submit(SlotRequest("b1", 1, group="b"))
    scheduler.submit(share("a1", 0.5, order=1, group="a"))
    assert [p.request_id for p in scheduler.schedule()] == ["a1", "b1"]
    assert scheduler.held_by("a") == 1.0 and scheduler.held_by("b") == 2


def test_fair_share_reason_names_fractions() -> None:
    pool = make_pool([1])
    scheduler = SlotScheduler(pool)
    scheduler.set_share("a", held=0.75)
    scheduler.set_share("b", held=0)
    scheduler.set_free_slots({}, {"a0": {0: 6}})
    scheduler.submit(share("a1", 0.5, group="a"))
    scheduler.submit(share("b1", 0.5, order=1, group="b"))
    assert scheduler.schedule() == []
    assert scheduler.why_waiting("a1").text == (
        "fair share: experiment a holds its share (0.75 of 0.5 slots)"
    )


def test_a_blocked_whole_head_is_not_starved_by_shares() -> None:
    """The head's reserved agent only drains: shares behind it go elsewhere or wait."""
    pool = make_pool([2, 2])
    scheduler = SlotScheduler(pool)
    scheduler.set_free_slots({"a0": {1}, "a1": set()}, {"a0": {0: 4}})
    scheduler.submit(SlotRequest("head", 2))
    scheduler.submit(share("s", 0.25, order=1))
    assert scheduler.schedule() == []
    assert scheduler.reserved == ("a0",)
    assert scheduler.why_waiting("s").kind == "reserved"


def test_a_blocked_share_head_reserves_the_agent_with_most_room() -> None:
    pool = make_pool([1, 1, 1])
    scheduler = SlotScheduler(pool)
    scheduler.set_free_slots({}, {"a0": {0: 7}, "a1": {0: 6}, "a2": {0: 7}})
    scheduler.submit(share("half", 0.5))
    scheduler.submit(share("eighth", 0.125, order=1))
    [placed] = scheduler.schedule()
    # a1 (2 eighths left) is held back for the half; the eighth goes to a0.
    assert scheduler.reserved == ("a1",)
    assert placed.request_id == "eighth" and where(placed) == [("a0", (0,))]


# -- preemption ----------------------------------------------------------------------


def _running(
    pool: ResourcePool, name: str, agent: int, slot: int, fraction: float, priority: int = 50
) -> RunningRequest:
    placement = Placement(
        name, pool.name, (AgentSlots(pool.agents[agent], (slot,)),), share=fraction
    )
    return RunningRequest(name, priority, placement, checkpointed=True)


def test_a_share_request_preempts_the_fewest_shares_on_one_slot() -> None:
    pool = make_pool([2], name="default")
    runs = [
        _running(pool, "q1", 0, 0, 0.25),
        _running(pool, "q2", 0, 0, 0.25),
        _running(pool, "h1", 0, 0, 0.5),
        _running(pool, "w", 0, 1, 1.0, priority=10),
    ]
    shared = {"a0": {0: 8}}
    victims = choose_preemptions(pool, {}, runs, share("urgent", 0.5, priority=1), shared=shared)
    # One half rather than two quarters; the whole trial outranks the others (priority 10).
    assert victims == ("h1",)
    victims = choose_preemptions(pool, {}, runs, share("q", 0.25, priority=1), shared=shared)
    assert victims == ("q2",)  # a quarter frees a quarter; the latest started goes


def test_a_share_request_may_stop_a_whole_trial_for_its_slot() -> None:
    pool = make_pool([1])
    runs = [_running(pool, "w", 0, 0, 1.0)]
    assert choose_preemptions(pool, {}, runs, share("s", 0.125, priority=1)) == ("w",)


def test_a_whole_request_stops_every_share_on_a_slot() -> None:
    pool = make_pool([1])
    runs = [_running(pool, "a", 0, 0, 0.5), _running(pool, "b", 0, 0, 0.25)]
    victims = choose_preemptions(
        pool, {}, runs, SlotRequest("w", 1, priority=1), shared={"a0": {0: 6}}
    )
    assert victims == ("a", "b")


def test_stopping_shares_count_as_room_already() -> None:
    pool = make_pool([1])
    stopping = RunningRequest(
        "a",
        50,
        Placement("a", pool.name, (AgentSlots(pool.agents[0], (0,)),), share=0.5),
        checkpointed=True,
        stopping=True,
    )
    victims = choose_preemptions(
        pool, {}, [stopping], share("s", 0.5, priority=1), shared={"a0": {0: 8}}
    )
    assert victims == ()


# -- every rule at once ----------------------------------------------------------------


@st.composite
def share_scenarios(
    draw: st.DrawFn,
) -> tuple[ResourcePool, dict[str, frozenset[int]], dict[str, dict[int, int]], list[SlotRequest]]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=4))
    pool = make_pool(sizes, policy=draw(st.sampled_from(["best", "worst"])))
    free: dict[str, frozenset[int]] = {}
    shared: dict[str, dict[int, int]] = {}
    for agent in pool.agents:
        ids, on_agent = set(), {}
        for slot in agent.slots:
            state = draw(st.sampled_from(["free", "whole", "shared"]))
            if state == "free":
                ids.add(slot)
            elif state == "shared":
                on_agent[slot] = draw(st.integers(min_value=1, max_value=EIGHTHS_PER_SLOT))
        free[agent.name] = frozenset(ids)
        if on_agent:
            shared[agent.name] = on_agent
    largest = max(sizes)
    queue = [
        SlotRequest(
            i,
            1 if fraction < 1 else draw(st.integers(min_value=1, max_value=largest)),
            priority=draw(st.sampled_from([1, 42, 42])),
            order=draw(st.integers(min_value=0, max_value=5)),
            share=fraction,
        )
        for i, fraction in enumerate(
            draw(st.lists(st.sampled_from([1.0, *SLOT_SHARES]), max_size=12))
        )
    ]
    return pool, free, shared, queue


@settings(max_examples=300, deadline=None)
@given(scenario=share_scenarios(), backfill=st.booleans())
def test_no_slot_ever_holds_more_than_one_slot_of_claims(
    scenario: tuple[
        ResourcePool, dict[str, frozenset[int]], dict[str, dict[int, int]], list[SlotRequest]
    ],
    backfill: bool,
) -> None:
    pool, free, shared, queue = scenario
    placed = schedule(pool, free, queue, backfill=backfill, shared=shared)
    requests = {r.request_id: r for r in queue}
    use: dict[tuple[str, int], int] = defaultdict(int)
    whole_now: set[tuple[str, int]] = set()
    for name, slots in shared.items():
        for slot, eighths in slots.items():
            use[name, slot] = eighths
    for placement in placed:
        request = requests[placement.request_id]
        assert placement.share == request.share and placement.slots == request.slots
        for part in placement.agents:
            for slot in part.slots:
                key = (part.agent.name, slot)
                if request.share < 1:
                    # A share lands on a free or shared slot, never on a whole one.
                    assert slot in free[part.agent.name] or slot in shared.get(part.agent.name, {})
                    assert key not in whole_now
                else:
                    assert slot in free[part.agent.name] and key not in use
                    whole_now.add(key)
                use[key] += placement.eighths
    assert all(eighths <= EIGHTHS_PER_SLOT for eighths in use.values())
    _packing_holds(pool, free, shared, queue, placed)


def _packing_holds(
    pool: ResourcePool,
    free: Mapping[str, frozenset[int]],
    shared: Mapping[str, Mapping[int, int]],
    queue: Sequence[SlotRequest],
    placed: Sequence[Placement],
) -> None:
    """Best fit: the first share placed went to a shared slot whenever one had room."""
    if pool.fitting_policy != "best" or not queue:
        return
    first = placed[0] if placed else None
    if first is None or first.share == 1.0:
        return
    room = any(
        EIGHTHS_PER_SLOT - used >= first.eighths
        for slots in shared.values()
        for used in slots.values()
    )
    (part,) = first.agents
    on_shared = part.slots[0] in shared.get(part.agent.name, {})
    assert on_shared or not room


@settings(max_examples=200, deadline=None)
@given(scenario=share_scenarios())
def test_a_kept_scheduler_with_shares_decides_like_a_fresh_one(
    scenario: tuple[
        ResourcePool, dict[str, frozenset[int]], dict[str, dict[int, int]], list[SlotRequest]
    ],
) -> None:
    pool, free, shared, queue = scenario
    kept = SlotScheduler(pool)
    for request in queue:
        kept.submit(request)
    kept.set_free_slots(free, shared)
    first = kept.schedule()
    assert first == schedule(pool, free, queue, shared=shared)
    for placement in first:
        kept.release(placement)
    # Every release undone: the kept state is the given one again.
    assert kept.free_slots() == {name: free.get(name, frozenset()) for name in free}
    assert kept.shared_slots() == {name: dict(slots) for name, slots in shared.items() if slots}


# -- preemption over random mixes of shares and whole trials ---------------------------

PreemptScenario = tuple[
    ResourcePool,
    dict[str, frozenset[int]],
    dict[str, dict[int, int]],
    list[RunningRequest],
    SlotRequest,
]


@st.composite
def preempt_scenarios(draw: st.DrawFn) -> PreemptScenario:
    """Share and whole trials placed by the core itself, some held by others, some stopping."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3))
    pool = make_pool(sizes)
    scheduler = SlotScheduler(pool)
    runs: list[RunningRequest] = []
    for i in range(draw(st.integers(min_value=0, max_value=16))):
        fraction = draw(st.sampled_from([1.0, *SLOT_SHARES]))
        slots = 1 if fraction < 1 else draw(st.integers(min_value=1, max_value=max(sizes)))
        scheduler.submit(SlotRequest(f"r{i}", slots, share=fraction))
        placed = scheduler.schedule()
        if not placed:
            scheduler.cancel(f"r{i}")
            continue
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            continue  # held by another search: preemption cannot stop it
        runs.append(
            RunningRequest(
                f"r{i}",
                draw(st.sampled_from([1, 42, 99])),
                placed[0],
                checkpointed=True,
                stopping=draw(st.integers(min_value=0, max_value=7)) == 0,
            )
        )
    fraction = draw(st.sampled_from([1.0, *SLOT_SHARES]))
    slots = 1 if fraction < 1 else draw(st.integers(min_value=1, max_value=max(sizes)))
    head = SlotRequest("head", slots, priority=draw(st.sampled_from([1, 42])), share=fraction)
    return pool, scheduler.free_slots(), scheduler.shared_slots(), runs, head


def _starts(
    pool: ResourcePool,
    free: Mapping[str, frozenset[int]],
    shared: Mapping[str, Mapping[int, int]],
    stopped: Sequence[RunningRequest],
    request: SlotRequest,
) -> bool:
    """Whether ``request`` fits once ``stopped`` have given their slots (or shares) back."""
    scheduler = SlotScheduler(pool, free, shared)
    for run in stopped:
        scheduler.release(run.placement)
    return scheduler.fits(request.slots, share=request.share)


@settings(max_examples=300, deadline=None)
@given(scenario=preempt_scenarios())
def test_victims_among_shares_make_room_and_none_is_redundant(scenario: PreemptScenario) -> None:
    pool, free, shared, runs, request = scenario
    chosen = choose_preemptions(pool, free, runs, request, shared=shared)
    stopping = [r for r in runs if r.stopping]
    allowed = [r for r in runs if not r.stopping and r.priority > request.priority]
    if chosen is None:
        assert not _starts(pool, free, shared, stopping + allowed, request)
        return
    if chosen == ():
        assert _starts(pool, free, shared, stopping, request)
        return
    by_id = {r.request_id: r for r in runs}
    victims = [by_id[i] for i in chosen]
    assert all(v in allowed for v in victims)
    assert not _starts(pool, free, shared, stopping, request)
    assert _starts(pool, free, shared, stopping + victims, request)
    for spared in victims:
        rest = [v for v in victims if v is not spared]
        assert not _starts(pool, free, shared, stopping + rest, request), spared.request_id
    if request.share < 1:
        # A share needs room on one slot: every victim is on the slot it frees.
        assert len({part.agent.name for v in victims for part in v.placement.agents}) == 1
