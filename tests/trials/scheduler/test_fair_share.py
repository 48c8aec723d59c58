"""Fair share between experiments sharing a pool, and why a request still waits."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trials.scheduler.conftest import all_free, free_counts, make_pool
from trials.scheduler import (
    Placement,
    ResourcePool,
    SlotRequest,
    SlotScheduler,
    WaitReason,
    schedule,
    valid_slots_per_trial,
)

Shares = dict[Hashable, tuple[int, float]]


def scheduler_for(
    pool: ResourcePool,
    queue: Sequence[SlotRequest],
    *,
    free: dict[str, frozenset[int]] | None = None,
    shares: Shares | None = None,
) -> SlotScheduler:
    scheduler = SlotScheduler(pool, free)
    for group, (held, weight) in (shares or {}).items():
        scheduler.set_share(group, held=held, weight=weight)
    for request in queue:
        scheduler.submit(request)
    return scheduler


def groups_of(placements: Sequence[Placement]) -> list[Hashable]:
    return [placement.group for placement in placements]


def one_slot_requests(group: str, count: int, *, first_order: int = 0) -> list[SlotRequest]:
    return [
        SlotRequest(f"{group}{i}", 1, order=first_order + i, group=group) for i in range(count)
    ]


# -- order ---------------------------------------------------------------------------


def test_on_equal_shares_the_group_served_least_recently_goes_first() -> None:
    # Trials that each take the whole pool: between them both groups hold nothing, so
    # held / weight ties; the one whose trial started longer ago goes next.
    pool = make_pool([2])
    queue = [
        SlotRequest("a1", 2, order=0, group="a"),
        SlotRequest("b1", 2, order=5, group="b"),
    ]
    scheduler = SlotScheduler(pool)
    scheduler.set_share("a", held=0, last_served=200.0)
    scheduler.set_share("b", held=0, last_served=100.0)
    for request in queue:
        scheduler.submit(request)
    assert [p.request_id for p in scheduler.schedule()] == ["b1"]
    # Never served goes before served; without any, FIFO decides.
    fresh = scheduler_for(pool, queue)
    fresh.set_share("a", held=0, last_served=100.0)
    assert [p.request_id for p in fresh.schedule()] == ["b1"]
    assert [p.request_id for p in scheduler_for(pool, queue).schedule()] == ["a1"]


def test_two_groups_of_equal_priority_take_turns_within_one_pass() -> None:
    pool = make_pool([1] * 6)
    # b's requests were all submitted after a's: FIFO alone would start a's six.
    queue = one_slot_requests("a", 6) + one_slot_requests("b", 6, first_order=6)
    placed = scheduler_for(pool, queue).schedule()
    assert groups_of(placed) == ["a", "b"] * 3
    assert [p.request_id for p in placed] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_a_group_of_weight_two_gets_twice_the_slots() -> None:
    pool = make_pool([1] * 9)
    queue = one_slot_requests("a", 20) + one_slot_requests("b", 20, first_order=20)
    scheduler = scheduler_for(pool, queue, shares={"a": (0, 2.0), "b": (0, 1.0)})
    placed = scheduler.schedule()
    assert groups_of(placed).count("a") == 6 and groups_of(placed).count("b") == 3
    assert (scheduler.held_by("a"), scheduler.held_by("b")) == (6, 3)


def test_slots_held_before_the_pass_count() -> None:
    pool = make_pool([1] * 6)
    queue = one_slot_requests("a", 6) + one_slot_requests("b", 6, first_order=6)
    placed = scheduler_for(pool, queue, shares={"a": (4, 1.0)}).schedule()
    # b catches up to a's 4 slots first; at 4 each, a's older requests win the tie.
    assert groups_of(placed) == ["b", "b", "b", "b", "a", "b"]


def test_priority_still_beats_fair_share() -> None:
    pool = make_pool([1] * 3)
    queue = [
        *one_slot_requests("poor", 3),
        *(SlotRequest(f"r{i}", 1, priority=1, order=10 + i, group="rich") for i in range(2)),
    ]
    placed = scheduler_for(pool, queue, shares={"rich": (100, 1.0)}).schedule()
    assert [p.request_id for p in placed] == ["r0", "r1", "poor0"]


def test_fifo_inside_a_group() -> None:
    pool = make_pool([4, 4])
    queue = [
        SlotRequest("third", 1, order=3, group="a"),
        SlotRequest("first", 2, order=1, group="a"),
        SlotRequest("second", 1, order=2, group="a"),
        SlotRequest("b", 1, order=0, group="b"),
    ]
    placed = scheduler_for(pool, queue, shares={"b": (50, 1.0)}).schedule()
    assert [p.request_id for p in placed] == ["first", "second", "third", "b"]


def test_release_lowers_what_the_group_holds() -> None:
    pool = make_pool([2, 2])
    scheduler = scheduler_for(pool, [SlotRequest("t", 2, group="a")], shares={"a": (3, 1.0)})
    [placed] = scheduler.schedule()
    assert placed.group == "a" and scheduler.held_by("a") == 5
    scheduler.release(placed)
    assert scheduler.held_by("a") == 3


def test_set_share_refuses_bad_values() -> None:
    scheduler = SlotScheduler(make_pool([2]))
    with pytest.raises(ValueError, match="held must be >= 0"):
        scheduler.set_share("a", held=-1)
    with pytest.raises(ValueError, match="weight must be > 0"):
        scheduler.set_share("a", held=0, weight=0.0)


def test_backfill_reservation_protects_a_blocked_head_across_groups() -> None:
    pool = make_pool([4, 4, 4])
    free = free_counts(pool, [0, 3, 1])
    queue = [
        SlotRequest("big", 8, order=0, group="a"),
        *(SlotRequest(f"small{i}", 1, order=1 + i, group="b") for i in range(4)),
    ]
    scheduler = scheduler_for(pool, queue, free=free)
    assert scheduler.schedule() == []
    assert scheduler.reserved == ("a1", "a2") and scheduler.blocked_head == "big"


def test_a_large_head_is_not_starved_by_another_groups_stream() -> None:
    """Group b keeps queueing small trials; a's 8-slot trial still starts within the bound."""
    pool = make_pool([4, 4, 4])
    for seed in range(30):
        rng = random.Random(seed)
        scheduler = SlotScheduler(pool)
        ends: dict[int, list[Placement]] = {}
        max_length, order, started = 5, 1, None
        # b fills the pool before a's trial arrives.
        for placement in scheduler_for(pool, one_slot_requests("b", 12)).schedule():
            ends.setdefault(rng.randint(1, max_length), []).append(placement)
        scheduler.set_share("b", held=12)
        scheduler.set_free_slots(free_counts(pool, [0, 0, 0]))
        scheduler.submit(SlotRequest("head", 8, order=0, group="a"))
        for tick in range(1, 2 * 4 * max_length + 2):
            for placement in ends.pop(tick, []):
                scheduler.release(placement)
            for _ in range(pool.total_slots):
                scheduler.submit(
                    SlotRequest(("b", order), rng.choice([1, 2]), order=order, group="b")
                )
                order += 1
            placed = scheduler.schedule()
            if any(p.request_id == "head" for p in placed):
                started = tick
                break
            for placement in placed:
                ends.setdefault(tick + rng.randint(1, max_length), []).append(placement)
        assert started is not None and started > 1, seed


# -- wait reasons ---------------------------------------------------------------------


def test_the_blocked_head_has_no_fit() -> None:
    pool = make_pool([4, 4])
    scheduler = scheduler_for(pool, [SlotRequest("big", 4)], free=free_counts(pool, [2, 3]))
    assert scheduler.schedule() == [] and scheduler.blocked_head == "big"
    assert scheduler.why_waiting("big") == WaitReason(
        "no_fit", "no agent in pool default has 4 free slots"
    )


def test_a_multi_agent_request_has_no_fit_in_whole_agents() -> None:
    pool = make_pool([4, 4, 4, 8])
    scheduler = scheduler_for(pool, [SlotRequest("t", 12)], free=free_counts(pool, [4, 3, 0, 8]))
    scheduler.schedule()
    assert scheduler.why_waiting("t") == WaitReason(
        "no_fit", "pool default has fewer than 3 free agents of 4 slots"
    )
    hetero = make_pool([8, 8, 8], heterogeneous=True)
    scheduler = scheduler_for(hetero, [SlotRequest("t", 12)], free=free_counts(hetero, [8, 3, 0]))
    scheduler.schedule()
    assert scheduler.why_waiting("t").text == (
        "pool default has fewer than 12 slots on whole free agents"
    )


def test_a_request_kept_off_reserved_agents_names_the_head() -> None:
    pool = make_pool([4, 4, 4])
    queue = [SlotRequest("big", 8, order=0), SlotRequest("small", 1, order=1)]
    scheduler = scheduler_for(pool, queue, free=free_counts(pool, [0, 3, 1]))
    scheduler.schedule()
    assert scheduler.why_waiting("small", label=lambda r: f"#{r}") == WaitReason(
        "reserved", "agents a1, a2 reserved for trial #big by backfilling", blocked_by="big"
    )


def test_a_request_behind_a_higher_priority() -> None:
    pool = make_pool([2])
    queue = [SlotRequest("urgent", 2, priority=1), SlotRequest("normal", 1, order=1)]
    scheduler = scheduler_for(pool, queue, free=free_counts(pool, [0]))
    assert scheduler.schedule() == []
    assert scheduler.why_waiting("normal") == WaitReason("priority", "behind priority 1 trials")
    assert scheduler.why_waiting("urgent").kind == "no_fit"
    # Reasons follow the queue: without the urgent trial, the slots are what is missing.
    scheduler.cancel("urgent")
    assert scheduler.why_waiting("normal") == WaitReason(
        "no_fit", "no agent in pool default has 1 free slot"
    )


def test_a_group_holding_its_share_waits_for_fair_share() -> None:
    pool = make_pool([1] * 4)
    queue = [SlotRequest("a1", 1, group="a"), SlotRequest("b1", 1, order=1, group="b")]
    scheduler = scheduler_for(
        pool, queue, free=free_counts(pool, [0] * 4), shares={"a": (3, 1.0), "b": (1, 1.0)}
    )
    assert scheduler.schedule() == []
    # Demands 4 and 2 of 4 slots: b gets the 2 it asks for, a the other 2.
    assert scheduler.why_waiting("a1", group_label=lambda g: f"exp-{g}") == WaitReason(
        "fair_share", "fair share: experiment exp-a holds its share (3 of 2 slots)"
    )
    assert scheduler.why_waiting("b1").kind == "no_fit"


def test_fair_shares_follow_the_weights() -> None:
    pool = make_pool([1] * 10)
    queue = [SlotRequest("a1", 1, group="a"), SlotRequest("b1", 1, order=1, group="b")]
    scheduler = scheduler_for(
        pool, queue, free=free_counts(pool, [0] * 10), shares={"a": (7, 2.0), "b": (3, 1.0)}
    )
    scheduler.schedule()
    # 10 slots at weights 2:1 -> 6.67 and 3.33.
    assert scheduler.why_waiting("a1").text == (
        "fair share: experiment a holds its share (7 of 6.7 slots)"
    )
    assert scheduler.why_waiting("b1").kind == "no_fit"


def test_fair_share_needs_another_group_waiting() -> None:
    pool = make_pool([1, 1])
    scheduler = scheduler_for(
        pool,
        [SlotRequest("a1", 1, group="a")],
        free=free_counts(pool, [0, 0]),
        shares={"a": (2, 1.0)},
    )
    scheduler.schedule()
    assert scheduler.why_waiting("a1").kind == "no_fit"


def test_why_waiting_refuses_a_request_that_is_not_queued() -> None:
    pool = make_pool([2])
    scheduler = scheduler_for(pool, [SlotRequest("t", 1)])
    scheduler.schedule()
    with pytest.raises(KeyError):
        scheduler.why_waiting("t")
    with pytest.raises(KeyError):
        scheduler.why_waiting("never")


def test_why_waiting_for_ten_thousand_requests_is_cheap() -> None:
    pool = make_pool([8] * 64)
    rng = random.Random(0)
    queue = [
        SlotRequest(
            i,
            rng.choice([1, 2, 4, 8, 16]),
            priority=rng.choice([10, 42, 42]),
            order=i,
            group=rng.randrange(8),
        )
        for i in range(10_000)
    ]
    scheduler = scheduler_for(pool, queue)
    placed = {p.request_id for p in scheduler.schedule()}
    waiting = [r.request_id for r in queue if r.request_id not in placed]
    # Its cost is measured by bench/scheduler_sim.py, never asserted here.
    reasons = [scheduler.why_waiting(request_id) for request_id in waiting]
    assert {r.kind for r in reasons} >= {"priority", "no_fit"}


# -- properties ------------------------------------------------------------------------


@st.composite
def shared_scenarios(
    draw: st.DrawFn,
) -> tuple[ResourcePool, dict[str, frozenset[int]], Shares, list[SlotRequest]]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6))
    pool = make_pool(
        sizes,
        heterogeneous=draw(st.booleans()),
        policy=draw(st.sampled_from(["best", "worst"])),
    )
    free = {
        agent.name: frozenset(draw(st.sets(st.sampled_from(agent.slots)))) for agent in pool.agents
    }
    groups = ["a", "b", "c"]
    shares: Shares = {
        group: (
            draw(st.integers(min_value=0, max_value=20)),
            draw(st.sampled_from([0.5, 1.0, 2.0])),
        )
        for group in groups
    }
    valid = valid_slots_per_trial(pool)
    queue = [
        SlotRequest(
            i,
            draw(st.sampled_from(valid)),
            priority=draw(st.sampled_from([1, 42, 42, 99])),
            order=draw(st.integers(min_value=0, max_value=5)),
            group=draw(st.sampled_from(groups)),
        )
        for i in range(draw(st.integers(min_value=0, max_value=12)))
    ]
    return pool, free, shares, queue


@settings(max_examples=300, deadline=None)
@given(scenario=shared_scenarios(), backfill=st.booleans())
def test_nothing_starts_while_a_higher_priority_request_that_fits_waits(
    scenario: tuple[ResourcePool, dict[str, frozenset[int]], Shares, list[SlotRequest]],
    backfill: bool,
) -> None:
    pool, free, shares, queue = scenario
    scheduler = scheduler_for(pool, queue, free=free, shares=shares)
    placed = scheduler.schedule(backfill=backfill)
    requests = {r.request_id: r for r in queue}
    placed_ids = {p.request_id for p in placed}
    waiting = [r for r in queue if r.request_id not in placed_ids]
    reserved = set(scheduler.reserved)
    state = {name: set(ids) for name, ids in free.items()}
    for placement in placed:
        request = requests[placement.request_id]
        # The free slots just before this placement (its own included), off the reservation.
        outside = {name: frozenset(ids) for name, ids in state.items() if name not in reserved}
        for other in waiting:
            if other.priority < request.priority:
                assert not schedule(pool, outside, [other]), (other, placement)
        for part in placement.agents:
            state[part.agent.name] -= set(part.slots)
    # What each group holds afterwards: what it held plus what it started.
    for group, (held, _) in shares.items():
        started = sum(p.slots for p in placed if p.group == group)
        assert scheduler.held_by(group) == held + started


@settings(max_examples=200, deadline=None)
@given(
    scenario=shared_scenarios(),
    backfill=st.booleans(),
    held=st.integers(min_value=0, max_value=50),
    weight=st.sampled_from([0.5, 1.0, 3.0]),
)
def test_a_single_group_decides_exactly_like_no_groups(
    scenario: tuple[ResourcePool, dict[str, frozenset[int]], Shares, list[SlotRequest]],
    backfill: bool,
    held: int,
    weight: float,
) -> None:
    pool, free, _, queue = scenario
    plain = [SlotRequest(r.request_id, r.slots, r.priority, r.order) for r in queue]
    one = [SlotRequest(r.request_id, r.slots, r.priority, r.order, group="x") for r in queue]
    expected = schedule(pool, free, plain, backfill=backfill)
    grouped = scheduler_for(pool, one, free=free, shares={"x": (held, weight)})
    got = grouped.schedule(backfill=backfill)
    assert [(p.request_id, p.agents) for p in got] == [(p.request_id, p.agents) for p in expected]
    assert all(p.group is None for p in expected) and all(p.group == "x" for p in got)


@settings(max_examples=200, deadline=None)
@given(scenario=shared_scenarios())
def test_every_waiting_request_has_a_reason(
    scenario: tuple[ResourcePool, dict[str, frozenset[int]], Shares, list[SlotRequest]],
) -> None:
    pool, free, shares, queue = scenario
    scheduler = scheduler_for(pool, queue, free=free, shares=shares)
    placed = {p.request_id for p in scheduler.schedule()}
    for request in queue:
        if request.request_id in placed:
            continue
        reason = scheduler.why_waiting(request.request_id)
        assert reason.text
        if reason.kind == "reserved":
            assert reason.blocked_by == scheduler.blocked_head is not None
        if request.request_id == scheduler.blocked_head:
            assert reason.kind == "no_fit"


def test_kept_scheduler_with_groups_over_many_passes() -> None:
    """A long-lived scheduler keeps ``held`` right through placements and releases."""
    pool = make_pool([2, 2, 4])
    rng = random.Random(7)
    scheduler = SlotScheduler(pool, all_free(pool))
    running: list[Placement] = []
    for step in range(200):
        group = rng.choice("abc")
        scheduler.submit(SlotRequest(step, rng.choice([1, 2, 4]), order=step, group=group))
        if running and rng.random() < 0.5:
            scheduler.release(running.pop(rng.randrange(len(running))))
        running += scheduler.schedule()
        for group in "abc":
            assert scheduler.held_by(group) == sum(p.slots for p in running if p.group == group)
