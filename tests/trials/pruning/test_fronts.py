"""The pure ranking of multi-objective successive halving: fronts, ties, crowding distance,
the promotion rule (exactly ASHA's with one objective), mixed directions, hypervolume."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trials.pruning import (
    Direction,
    crowding_distances,
    dominates,
    hypervolume_2d,
    non_dominated_fronts,
    pareto_front,
    promoted,
    rank_keys,
    ranked_ahead,
)

MIN2: list[Direction] = ["minimize", "minimize"]


def _brute_fronts(points: list[tuple[float, ...]], directions: list[Direction]) -> list[int]:
    """Each point's front by definition: one more than the deepest front dominating it."""
    front = [0] * len(points)
    order = sorted(
        range(len(points)),
        key=lambda i: sum(dominates(p, points[i], directions) for p in points),
    )
    for i in order:
        dominators = [j for j in range(len(points)) if dominates(points[j], points[i], directions)]
        front[i] = 1 + max((front[j] for j in dominators), default=-1)
    return front


def _front_of(fronts: list[list[int]], n: int) -> list[int]:
    found = [0] * n
    for number, front in enumerate(fronts):
        for index in front:
            found[index] = number
    return found


def test_fronts_peel_the_dominated_layers() -> None:
    points = [(1, 5), (2, 3), (4, 1), (3, 4), (5, 5), (2, 3), (6, 6)]
    assert non_dominated_fronts(points, MIN2) == [[0, 1, 2, 5], [3], [4], [6]]


def test_equal_points_share_a_front_and_a_distance() -> None:
    points = [(1.0, 2.0), (1.0, 2.0), (0.0, 3.0), (2.0, 0.0)]
    assert non_dominated_fronts(points, MIN2) == [[0, 1, 2, 3]]
    distances = crowding_distances(points, [0, 1, 2, 3], MIN2)
    assert distances[0] == distances[1] == 2.0
    assert distances[2] == distances[3] == math.inf


def test_a_front_equal_on_every_objective_ties_at_zero() -> None:
    points = [(3.0, 3.0)] * 4
    assert crowding_distances(points, [0, 1, 2, 3], MIN2) == dict.fromkeys(range(4), 0.0)
    assert rank_keys(points, MIN2) == [(0, 0.0)] * 4
    # Every tie is promoted together, as ASHA promotes values equal to the last place.
    assert [promoted(points, MIN2, i, 3) for i in range(4)] == [True] * 4


def test_mixed_directions_flip_only_the_maximized_objective() -> None:
    # accuracy (maximize) against slot-seconds (minimize)
    directions: list[Direction] = ["maximize", "minimize"]
    points = [(0.90, 10.0), (0.95, 10.0), (0.95, 20.0), (0.80, 5.0), (0.70, 8.0)]
    assert dominates(points[1], points[0], directions)
    assert dominates(points[1], points[2], directions)
    assert dominates(points[3], points[4], directions)
    assert non_dominated_fronts(points, directions) == [[1, 3], [0, 2, 4]]
    # Both directions flipped: every relation reverses.
    flipped: list[Direction] = ["minimize", "maximize"]
    assert non_dominated_fronts(points, flipped) == [[0, 2, 4], [1, 3]]
    # A minimized copy (accuracy negated) ranks exactly the same way.
    negated = [(-a, c) for a, c in points]
    assert rank_keys(negated, MIN2) == rank_keys(points, directions)


def test_crowding_keeps_the_extremes_of_a_cut_front() -> None:
    # Seven trials on one front (accuracy up, compute down) and one dominated; the rung
    # keeps two (8 // 3): the most accurate and the cheapest, not two of the middle.
    directions: list[Direction] = ["maximize", "minimize"]
    front = [(0.80, 1.0), (0.84, 2.0), (0.86, 3.0), (0.88, 5.0), (0.90, 8.0), (0.91, 13.0)]
    points = [*front, (0.92, 30.0), (0.70, 20.0)]
    kept = [i for i in range(len(points)) if promoted(points, directions, i, 3)]
    assert kept == [0, 6]
    assert ranked_ahead(points, directions, 7) == 7


def test_an_infinite_value_ranks_without_breaking_the_order() -> None:
    points = [(1.0, math.inf), (2.0, 1.0), (3.0, 0.5), (4.0, 4.0)]
    assert non_dominated_fronts(points, MIN2) == [[0, 1, 2], [3]]
    keys = rank_keys(points, MIN2)
    assert all(not math.isnan(distance) for _, distance in keys)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="2 values for 3 objectives"):
        non_dominated_fronts([(1.0, 2.0)], ["minimize"] * 3)
    with pytest.raises(ValueError, match="NaN"):
        non_dominated_fronts([(1.0, math.nan)], MIN2)
    with pytest.raises(ValueError, match="direction 'up'"):
        non_dominated_fronts([(1.0,)], ["up"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="reduction_factor"):
        promoted([(1.0,)], ["minimize"], 0, 1)


_VALUES = st.integers(0, 6).map(float)


@given(
    points=st.lists(st.tuples(_VALUES, _VALUES), min_size=1, max_size=25),
    directions=st.lists(st.sampled_from(["minimize", "maximize"]), min_size=2, max_size=2),
)
def test_two_objective_sweep_matches_the_definition(
    points: list[tuple[float, float]], directions: list[Direction]
) -> None:
    fronts = non_dominated_fronts(points, directions)
    assert _front_of(fronts, len(points)) == _brute_fronts(points, directions)


@given(points=st.lists(st.tuples(_VALUES, _VALUES, _VALUES), min_size=1, max_size=15))
def test_three_objective_fronts_match_the_definition(
    points: list[tuple[float, float, float]],
) -> None:
    directions: list[Direction] = ["minimize", "maximize", "minimize"]
    fronts = non_dominated_fronts(points, directions)
    assert _front_of(fronts, len(points)) == _brute_fronts(points, directions)
    assert sorted(fronts[0]) == pareto_front(points, directions)


@given(
    values=st.lists(st.integers(0, 9).map(float), min_size=1, max_size=30),
    reduction_factor=st.integers(2, 5),
    maximize=st.booleans(),
)
def test_one_objective_reduces_exactly_to_ashas_rule(
    values: list[float], reduction_factor: int, maximize: bool
) -> None:
    """ASHA (Li et al. 2020; Optuna's ``SuccessiveHalvingPruner``): a trial goes on when
    its value is no worse than the ``k``-th best of the ``n`` values at the rung, ``k =
    max(1, n // reduction_factor)``."""
    direction: Direction = "maximize" if maximize else "minimize"
    points = [(value,) for value in values]
    k = max(1, len(values) // reduction_factor)
    kth_best = sorted(values, reverse=maximize)[k - 1]
    for index, value in enumerate(values):
        asha = value >= kth_best if maximize else value <= kth_best
        assert promoted(points, [direction], index, reduction_factor) == asha


@given(
    points=st.lists(st.tuples(_VALUES, _VALUES), min_size=1, max_size=20),
    reduction_factor=st.integers(2, 4),
)
def test_at_least_the_promotable_share_goes_on_and_the_front_leads(
    points: list[tuple[float, float]], reduction_factor: int
) -> None:
    went_on = [i for i in range(len(points)) if promoted(points, MIN2, i, reduction_factor)]
    assert len(went_on) >= max(1, len(points) // reduction_factor)
    first = set(non_dominated_fronts(points, MIN2)[0])
    # A dominated trial goes on only when the whole first front does.
    if not first.issuperset(went_on):
        assert first.issubset(went_on)


def test_hypervolume_of_a_front_against_its_reference() -> None:
    directions: list[Direction] = ["maximize", "minimize"]
    reference = (0.5, 100.0)
    front = [(0.9, 50.0), (0.8, 20.0)]
    assert hypervolume_2d(front, directions, reference) == pytest.approx(0.4 * 50 + 0.3 * 30)
    # Dominated points and points beyond the reference add nothing.
    more = [*front, (0.7, 40.0), (0.4, 1.0), (0.95, 120.0)]
    assert hypervolume_2d(more, directions, reference) == pytest.approx(29.0)
    # A point beyond the front adds its own rectangle.
    assert hypervolume_2d([*front, (0.95, 80.0)], directions, reference) == pytest.approx(30.0)
    assert hypervolume_2d([], directions, reference) == 0.0
    with pytest.raises(ValueError, match="two objectives"):
        hypervolume_2d([(1.0,)], ["minimize"], (2.0,))


@given(points=st.lists(st.tuples(_VALUES, _VALUES), max_size=12))
def test_hypervolume_matches_a_grid_count(points: list[tuple[float, float]]) -> None:
    reference = (7.0, 7.0)
    cells = sum(
        any(px <= x and py <= y for px, py in points)
        for x, y in itertools.product(range(7), range(7))
    )
    assert hypervolume_2d(points, MIN2, reference) == cells
