"""Which slots_per_trial a pool can ever run, and the one-line rejection of the rest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.trials.scheduler.conftest import all_free, make_pool
from trials.scheduler import (
    ResourcePool,
    SlotRequest,
    Unschedulable,
    check_schedulable,
    format_values,
    job_shape,
    largest_fit,
    schedule,
    valid_slots_per_trial,
)


def test_whole_agents_of_eight_allow_multiples_of_eight_only() -> None:
    pool = make_pool([8] * 4)
    assert valid_slots_per_trial(pool) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32]


def test_twelve_slots_on_eight_slot_agents_is_rejected_in_one_line() -> None:
    with pytest.raises(Unschedulable) as info:
        check_schedulable(make_pool([8] * 4), 12)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "resource pool 'default' cannot fit slots_per_trial=12 (a trial larger than one agent "
        "takes whole agents of one size): agents have 8 slots (x4); "
        "valid slots_per_trial: 1-8, 16, 24, 32"
    )
    assert info.value.valid == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32]
    assert info.value.pool == "default" and info.value.slots_per_trial == 12


def test_more_slots_than_the_pool_has_is_rejected() -> None:
    with pytest.raises(
        Unschedulable, match=r"slots_per_trial=40 \(more than the pool's 32 slots\)"
    ):
        check_schedulable(make_pool([8] * 4), 40)


def test_heterogeneous_fits_allow_any_total_up_to_the_pool() -> None:
    pool = make_pool([8] * 4, heterogeneous=True)
    check_schedulable(pool, 12)
    assert valid_slots_per_trial(pool) == list(range(1, 33))
    with pytest.raises(
        Unschedulable, match="heterogeneous fits allowed; valid slots_per_trial: 1-32"
    ):
        check_schedulable(pool, 33)


def test_mixed_agent_sizes_list_every_size() -> None:
    pool = make_pool([8, 8, 4, 4, 4])
    # 12 = 3 x 4 and 16 = 2 x 8 (or 4 x 4, but there are only three 4-slot agents).
    assert valid_slots_per_trial(pool) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]
    with pytest.raises(Unschedulable, match=r"agents have 8 slots \(x2\), 4 slots \(x3\)"):
        check_schedulable(pool, 20)


def test_large_pools_print_progressions_compactly() -> None:
    pool = make_pool([8] * 512)
    with pytest.raises(Unschedulable, match=r"valid slots_per_trial: 1-8, 16, 24, \.\.\., 4096$"):
        check_schedulable(pool, 12)


def test_pool_without_agents_runs_nothing() -> None:
    pool = make_pool([])
    assert valid_slots_per_trial(pool) == []
    with pytest.raises(Unschedulable, match="has no agents"):
        check_schedulable(pool, 1)


def test_zero_slots_is_rejected() -> None:
    with pytest.raises(Unschedulable, match=r"slots_per_trial=0 \(it must be at least 1\)"):
        check_schedulable(make_pool([2]), 0)


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ([], "none"),
        ([3], "3"),
        ([1, 2], "1, 2"),
        ([1, 2, 3], "1-3"),
        ([1, 2, 3, 4, 16, 24, 32], "1-4, 16, 24, 32"),
        ([1, 2, 3, 8, 16, 24, 32, 40], "1-3, 8, 16, ..., 40"),
        ([2, 4, 6, 8], "2, 4, ..., 8"),
    ],
)
def test_format_values(values: list[int], text: str) -> None:
    assert format_values(values) == text


pools = st.builds(
    make_pool,
    st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=6),
    heterogeneous=st.booleans(),
    policy=st.sampled_from(["best", "worst"]),
)


@settings(max_examples=300, deadline=None)
@given(pool=pools, slots=st.integers(min_value=0, max_value=50))
def test_valid_values_agree_with_check_and_with_an_idle_pool(
    pool: ResourcePool, slots: int
) -> None:
    """A value is listed as valid exactly when it passes the check and starts on an idle pool."""
    valid = slots in valid_slots_per_trial(pool)
    try:
        check_schedulable(pool, slots)
        passes = True
    except Unschedulable as exc:
        passes = False
        assert "\n" not in str(exc)
    assert valid == passes
    if slots >= 1:
        if valid:
            placed = schedule(pool, all_free(pool), [SlotRequest("t", slots)])
            assert [p.slots for p in placed] == [slots]
        else:
            with pytest.raises(Unschedulable):
                schedule(pool, all_free(pool), [SlotRequest("t", slots)])


@given(
    sizes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=6),
    slots=st.integers(min_value=1, max_value=40),
)
@settings(max_examples=300, deadline=None)
def test_a_job_shape_exists_exactly_for_the_sizes_the_scheduler_accepts(
    sizes: list[int], slots: int
) -> None:
    pool = make_pool(sizes)
    valid = slots in valid_slots_per_trial(pool)
    if not valid:
        with pytest.raises(Unschedulable):
            job_shape(pool, slots)
        return
    nodes, per_node = job_shape(pool, slots)
    assert nodes * per_node == slots
    # One node when one agent holds it; else whole agents of one size, as few as can.
    if slots <= max(sizes):
        assert nodes == 1
    else:
        assert per_node in sizes and sizes.count(per_node) >= nodes
        assert all(
            slots % size or slots // size > sizes.count(size) or slots // size >= nodes
            for size in sizes
        )


def test_the_largest_fit_is_the_size_itself_or_the_largest_smaller_one_that_fits() -> None:
    one_gpu = make_pool([1])
    assert largest_fit(one_gpu, 1) == 1
    assert largest_fit(one_gpu, 2) == 1
    # Larger than one agent: whole agents of one size, so 12 on 8-slot agents becomes 8.
    four = make_pool([8] * 4)
    assert [largest_fit(four, n) for n in (8, 12, 16, 40)] == [8, 8, 16, 32]
    with pytest.raises(Unschedulable, match="has no agents"):
        largest_fit(ResourcePool("default", ()), 2)
