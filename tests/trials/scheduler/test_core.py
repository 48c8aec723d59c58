"""The scheduler core: fits, gang scheduling, order, backfilling and no starvation."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trials.scheduler.conftest import all_free, free_counts, make_pool
from trials.scheduler import (
    AgentSlots,
    Placement,
    ResourcePool,
    SlotRequest,
    SlotScheduler,
    Unschedulable,
    schedule,
    valid_slots_per_trial,
)


def where(placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
    return [(part.agent.name, part.slots) for part in placement.agents]


# -- fitting -----------------------------------------------------------------------


def test_best_fit_takes_the_agent_with_fewest_free_slots_that_still_fit() -> None:
    pool = make_pool([4, 4, 4])
    [placed] = schedule(pool, free_counts(pool, [4, 1, 2]), [SlotRequest("t", 2)])
    assert where(placed) == [("a2", (2, 3))]


def test_worst_fit_takes_the_agent_with_most_free_slots() -> None:
    pool = make_pool([4, 4, 4], policy="worst")
    [placed] = schedule(pool, free_counts(pool, [3, 1, 4]), [SlotRequest("t", 2)])
    assert where(placed) == [("a2", (0, 1))]


def test_ties_go_to_the_agent_declared_first() -> None:
    pool = make_pool([2, 2, 2])
    placed = schedule(pool, all_free(pool), [SlotRequest(i, 1, order=i) for i in range(3)])
    # Best fit fills a0 before touching a whole agent.
    assert [where(p) for p in placed] == [[("a0", (0,))], [("a0", (1,))], [("a1", (0,))]]


def test_gang_scheduling_never_splits_a_one_agent_request() -> None:
    pool = make_pool([4, 4])
    # Six slots are free in total, but no agent has four.
    assert schedule(pool, free_counts(pool, [3, 3]), [SlotRequest("t", 4)]) == []


def test_multi_agent_requests_take_whole_free_agents_only() -> None:
    pool = make_pool([4, 4, 4, 4])
    # a0 has 3 of 4 slots free: not usable for an 8-slot trial.
    [placed] = schedule(pool, free_counts(pool, [3, 4, 0, 4]), [SlotRequest("t", 8)])
    assert where(placed) == [("a1", (0, 1, 2, 3)), ("a3", (0, 1, 2, 3))]
    assert schedule(pool, free_counts(pool, [3, 4, 0, 3]), [SlotRequest("t", 8)]) == []


def test_mixed_sizes_use_the_largest_agents_that_divide_the_request() -> None:
    pool = make_pool([4, 4, 4, 4, 8, 8])
    [placed] = schedule(pool, all_free(pool), [SlotRequest("t", 16)])
    assert [name for name, _ in where(placed)] == ["a4", "a5"]
    # With the 8-slot agents busy, 16 = 4 x 4 still fits.
    [placed] = schedule(pool, free_counts(pool, [4, 4, 4, 4, 0, 0]), [SlotRequest("t", 16)])
    assert [name for name, _ in where(placed)] == ["a0", "a1", "a2", "a3"]


def test_heterogeneous_fit_uses_whole_agents_and_part_of_the_last() -> None:
    pool = make_pool([8, 8, 8], heterogeneous=True)
    [placed] = schedule(pool, all_free(pool), [SlotRequest("t", 12)])
    assert where(placed) == [("a0", tuple(range(8))), ("a1", (0, 1, 2, 3))]


def test_heterogeneous_fit_prefers_large_agents_and_a_snug_last_one() -> None:
    pool = make_pool([2, 8, 4, 8], heterogeneous=True)
    [placed] = schedule(pool, all_free(pool), [SlotRequest("t", 11)])
    assert [(name, len(slots)) for name, slots in where(placed)] == [
        ("a1", 8),
        ("a2", 3),
    ]


def test_heterogeneous_fit_needs_whole_free_agents() -> None:
    pool = make_pool([4, 4, 4], heterogeneous=True)
    assert schedule(pool, free_counts(pool, [4, 3, 3]), [SlotRequest("t", 6)]) == []


def test_slots_are_the_lowest_free_ids() -> None:
    pool = make_pool([4])
    [placed] = schedule(pool, {"a0": frozenset({3, 1, 2})}, [SlotRequest("t", 2)])
    assert where(placed) == [("a0", (1, 2))]


def test_agents_missing_from_free_slots_have_none_free() -> None:
    pool = make_pool([2, 2])
    [placed] = schedule(pool, {"a1": frozenset({0, 1})}, [SlotRequest("t", 2)])
    assert where(placed) == [("a1", (0, 1))]


def test_bad_inputs_are_refused() -> None:
    pool = make_pool([2])
    with pytest.raises(ValueError, match="not in resource pool 'default': zz"):
        schedule(pool, {"zz": frozenset()}, [])
    with pytest.raises(ValueError, match="has no slots \\[5\\]"):
        schedule(pool, {"a0": frozenset({5})}, [])
    with pytest.raises(ValueError, match="already queued"):
        schedule(pool, all_free(pool), [SlotRequest("t", 1), SlotRequest("t", 1)])
    with pytest.raises(Unschedulable, match="slots_per_trial=3"):
        schedule(pool, all_free(pool), [SlotRequest("t", 3)])


# -- order and backfilling ------------------------------------------------------------


def test_lower_priority_number_first_then_fifo() -> None:
    pool = make_pool([1])
    queue = [
        SlotRequest("late", 1, priority=42, order=2),
        SlotRequest("early", 1, priority=42, order=1),
        SlotRequest("urgent", 1, priority=1, order=3),
    ]
    scheduler = SlotScheduler(pool)
    for request in queue:
        scheduler.submit(request)
    started = []
    for _ in range(3):
        [placed] = scheduler.schedule()
        started.append(placed.request_id)
        scheduler.release(placed)
    assert started == ["urgent", "early", "late"]


def test_backfill_starts_small_requests_away_from_the_blocked_head() -> None:
    pool = make_pool([4, 4, 4])
    # a0 is busy, a1 has 3 free, a2 has 1 free: the 8-slot head needs two whole agents.
    free = free_counts(pool, [0, 3, 1])
    queue = [SlotRequest("big", 8, order=0), SlotRequest("small", 1, order=1)]
    scheduler = SlotScheduler(pool, free)
    for request in queue:
        scheduler.submit(request)
    placed = scheduler.schedule()
    # The head reserves the two agents with the most free slots; a0 is full, so the
    # small request has nowhere to go without delaying the head.
    assert scheduler.reserved == ("a1", "a2")
    assert placed == []


def test_backfill_fills_agents_the_head_does_not_need() -> None:
    pool = make_pool([4, 4, 4, 4])
    free = free_counts(pool, [2, 3, 1, 0])
    queue = [
        SlotRequest("big", 8, order=0),
        SlotRequest("s1", 1, order=1),
        SlotRequest("s2", 2, order=2),
    ]
    scheduler = SlotScheduler(pool, free)
    for request in queue:
        scheduler.submit(request)
    placed = scheduler.schedule()
    assert scheduler.reserved == ("a0", "a1")
    # The small ones pack onto a2 (1 free) and... nothing else: a3 is full.
    assert [(p.request_id, where(p)) for p in placed] == [("s1", [("a2", (3,))])]
    # Without backfill the blocked head stops everything behind it.
    assert schedule(pool, free, queue, backfill=False) == []


def test_a_request_that_fits_is_not_held_back_by_a_later_one() -> None:
    pool = make_pool([4, 4])
    queue = [
        SlotRequest("a", 4, order=0),
        SlotRequest("b", 8, order=1),
        SlotRequest("c", 4, order=2),
    ]
    placed = schedule(pool, all_free(pool), queue)
    # "a" takes a0; "b" is blocked and reserves a1; "c" may not take a1.
    assert [p.request_id for p in placed] == ["a"]


def run_until_placed(
    pool: ResourcePool,
    busy: Mapping[str, Sequence[int]],
    *,
    head_slots: int,
    small_sizes: Sequence[int],
    max_length: int,
    seed: int,
    limit: int,
) -> int | None:
    """Ticks until a large head request starts while small requests keep arriving."""
    rng = random.Random(seed)
    scheduler = SlotScheduler(
        pool,
        {a.name: frozenset(a.slots) - frozenset(busy.get(a.name, ())) for a in pool.agents},
    )
    # What already runs: one single-slot trial per busy slot, each with its own end.
    ends: dict[int, list[Placement]] = {}
    for agent in pool.agents:
        for slot in busy.get(agent.name, ()):
            placement = Placement(
                ("old", agent.name, slot), pool.name, (AgentSlots(agent, (slot,)),)
            )
            ends.setdefault(rng.randint(1, max_length), []).append(placement)
    scheduler.submit(SlotRequest("head", head_slots, order=0))
    order = 1
    for tick in range(1, limit + 1):
        for placement in ends.pop(tick, []):
            scheduler.release(placement)
        # More small work arrives every tick than the cluster could ever finish.
        for _ in range(pool.total_slots):
            scheduler.submit(SlotRequest(("small", order), rng.choice(small_sizes), order=order))
            order += 1
        for placement in scheduler.schedule():
            if placement.request_id == "head":
                return tick
            ends.setdefault(tick + rng.randint(1, max_length), []).append(placement)
    return None


@settings(max_examples=60, deadline=None)
@given(
    agents=st.integers(min_value=2, max_value=6),
    size=st.sampled_from([2, 4]),
    k=st.integers(min_value=1, max_value=3),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_a_large_head_is_never_starved_by_a_stream_of_small_requests(
    agents: int, size: int, k: int, seed: int
) -> None:
    k = min(k, agents)
    pool = make_pool([size] * agents)
    rng = random.Random(seed)
    busy = {a.name: [s for s in a.slots if rng.random() < 0.7] for a in pool.agents}
    max_length = 5
    # The bound from the module's rule: at most k * size trial lengths.
    limit = k * size * max_length + 1
    started = run_until_placed(
        pool,
        busy,
        head_slots=k * size,
        small_sizes=[1, 2],
        max_length=max_length,
        seed=seed,
        limit=limit,
    )
    assert started is not None and started <= limit


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=5),
    extra=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_a_heterogeneous_head_is_never_starved(sizes: list[int], extra: int, seed: int) -> None:
    pool = make_pool(sizes, heterogeneous=True)
    head = min(max(sizes) + extra, pool.total_slots)
    rng = random.Random(seed)
    busy = {a.name: [s for s in a.slots if rng.random() < 0.7] for a in pool.agents}
    limit = pool.total_slots * 5 + 1
    started = run_until_placed(
        pool, busy, head_slots=head, small_sizes=[1, 2], max_length=5, seed=seed, limit=limit
    )
    assert started is not None


def test_a_one_agent_head_is_never_starved_either() -> None:
    pool = make_pool([4, 4, 4])
    for seed in range(50):
        started = run_until_placed(
            pool,
            {"a0": [0, 1], "a1": [0], "a2": [2, 3]},
            head_slots=4,
            small_sizes=[1, 2, 3],
            max_length=6,
            seed=seed,
            limit=4 * 6 + 1,
        )
        assert started is not None


def test_without_backfill_small_requests_wait_behind_the_head() -> None:
    pool = make_pool([2, 2])
    queue = [SlotRequest("big", 4, order=0), SlotRequest("small", 1, order=1)]
    assert schedule(pool, free_counts(pool, [2, 1]), queue, backfill=False) == []
    assert [
        p.request_id for p in schedule(pool, free_counts(pool, [2, 2]), queue, backfill=False)
    ] == ["big"]


# -- properties over random pools, free slots and queues -----------------------------


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[ResourcePool, dict[str, frozenset[int]], list[SlotRequest]]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6))
    pool = make_pool(
        sizes,
        heterogeneous=draw(st.booleans()),
        policy=draw(st.sampled_from(["best", "worst"])),
    )
    free = {
        agent.name: frozenset(draw(st.sets(st.sampled_from(agent.slots)))) for agent in pool.agents
    }
    valid = valid_slots_per_trial(pool)
    queue = [
        SlotRequest(
            i,
            draw(st.sampled_from(valid)),
            priority=draw(st.sampled_from([1, 42, 42, 99])),
            order=draw(st.integers(min_value=0, max_value=5)),
        )
        for i in range(draw(st.integers(min_value=0, max_value=10)))
    ]
    return pool, free, queue


def sorted_queue(queue: Sequence[SlotRequest]) -> list[SlotRequest]:
    return sorted(queue, key=lambda r: (r.priority, r.order, queue.index(r)))


@settings(max_examples=250, deadline=None)
@given(scenario=scenarios(), backfill=st.booleans())
def test_placements_obey_every_rule(
    scenario: tuple[ResourcePool, dict[str, frozenset[int]], list[SlotRequest]], backfill: bool
) -> None:
    pool, free, queue = scenario
    placed = schedule(pool, free, queue, backfill=backfill)
    largest = max(agent.size for agent in pool.agents)
    requests = {r.request_id: r for r in queue}
    used: set[tuple[str, int]] = set()
    for placement in placed:
        request = requests[placement.request_id]
        # Gang: exactly the requested number of slots, all of them free.
        assert placement.slots == request.slots
        for part in placement.agents:
            assert part.slots and set(part.slots) <= free[part.agent.name]
            for slot in part.slots:
                assert (part.agent.name, slot) not in used  # never double-assigned
                used.add((part.agent.name, slot))
        if request.slots <= largest:
            assert len(placement.agents) == 1
        else:
            # Several agents, each completely free beforehand.
            assert len(placement.agents) >= 2
            assert len({part.agent.name for part in placement.agents}) == len(placement.agents)
            for part in placement.agents:
                assert free[part.agent.name] == frozenset(part.agent.slots)
            if pool.allowing_heterogeneous_fits:
                assert all(len(p.slots) == p.agent.size for p in placement.agents[:-1])
            else:
                sizes = {part.agent.size for part in placement.agents}
                assert len(sizes) == 1
                assert all(len(p.slots) == p.agent.size for p in placement.agents)
    ordered = sorted_queue(queue)
    placed_ids = [p.request_id for p in placed]
    if ordered:
        head = ordered[0]
        # The first request in order starts whenever it fits on its own.
        alone = schedule(pool, free, [head])
        assert (head.request_id in placed_ids) == bool(alone)
    if not backfill:
        # Plain FIFO: what starts is a prefix of the queue order.
        assert placed_ids == [r.request_id for r in ordered[: len(placed_ids)]]


@settings(max_examples=200, deadline=None)
@given(scenario=scenarios())
def test_a_kept_scheduler_decides_like_a_fresh_one(
    scenario: tuple[ResourcePool, dict[str, frozenset[int]], list[SlotRequest]],
) -> None:
    """Incremental updates (the simulation's way) and a fresh build (the driver's) agree."""
    pool, free, queue = scenario
    kept = SlotScheduler(pool)
    for request in queue:
        kept.submit(request)
    # Reach ``free`` through the kept scheduler's own bookkeeping.
    kept.set_free_slots(free)
    first = kept.schedule()
    assert first == schedule(pool, free, queue)
    # After releasing what started, a fresh scheduler on the same state agrees again.
    for placement in first:
        kept.release(placement)
    remaining = [r for r in queue if r.request_id not in {p.request_id for p in first}]
    assert kept.free_slots() == free
    assert kept.schedule() == schedule(pool, free, remaining)


def test_cancel_drops_a_queued_request() -> None:
    pool = make_pool([2])
    scheduler = SlotScheduler(pool)
    scheduler.submit(SlotRequest("a", 2))
    scheduler.submit(SlotRequest("b", 1, order=1))
    assert scheduler.cancel("a") and not scheduler.cancel("a")
    assert [p.request_id for p in scheduler.schedule()] == ["b"]
    assert scheduler.queued == 0


def test_release_refuses_slots_that_are_already_free() -> None:
    pool = make_pool([2])
    scheduler = SlotScheduler(pool)
    scheduler.submit(SlotRequest("a", 1))
    [placed] = scheduler.schedule()
    scheduler.release(placed)
    with pytest.raises(ValueError, match="not all in use"):
        scheduler.release(placed)
