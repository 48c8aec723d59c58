"""Pareto fronts of objective vectors and the rung order of multi-objective successive halving.

Pure functions on plain sequences of floats, no I/O and no Optuna, so the pruner
(:mod:`trials.pruning._pareto_asha`), the UI and the benchmarks share one definition.

The order a rung ranks trials by (MO-ASHA, Schmucker et al. 2021) is non-dominated
sorting, then NSGA-II's crowding distance within a front. Crowding distance rather than
Syne Tune's default epsilon-net, for three reasons. The objectives have unrelated scales
(an accuracy in [0, 1] against slot-seconds in the hundreds): an epsilon-net's greedy
farthest-point order, on raw Euclidean distances, is decided by the compute axis alone,
while crowding distance divides each objective's gaps by its range in the front. It
always keeps a front's extremes (the most accurate trial and the cheapest at the rung),
which are the ends a user of a quality-against-cost front picks from. And it is
deterministic, with exact ties (the epsilon-net's order depends on a seed point), so
with one objective the rule is ASHA's to the last tie.

A trial is promoted from a rung of ``n`` trials when fewer than ``max(1, n //
reduction_factor)`` trials rank strictly ahead of it (an earlier front, or its front
with a larger crowding distance): ties are promoted together, as Optuna's
``SuccessiveHalvingPruner`` promotes a value equal to the last promotable one.

Example:
    >>> points = [(0.95, 40.0), (0.90, 10.0), (0.85, 30.0), (0.97, 90.0), (0.80, 50.0)]
    >>> directions = ["maximize", "minimize"]  # accuracy up, slot-seconds down
    >>> non_dominated_fronts(points, directions)
    [[0, 1, 3], [2], [4]]
    >>> [promoted(points, directions, i, reduction_factor=3) for i in range(5)]
    [False, True, False, True, False]
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Literal

Direction = Literal["minimize", "maximize"]
Point = Sequence[float]


def _minimized(
    points: Sequence[Point], directions: Sequence[Direction]
) -> list[tuple[float, ...]]:
    """``points`` with every maximized objective negated; checks their shape."""
    signs = []
    for direction in directions:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"direction {direction!r}: must be 'minimize' or 'maximize'")
        signs.append(-1.0 if direction == "maximize" else 1.0)
    converted = []
    for point in points:
        if len(point) != len(signs):
            raise ValueError(
                f"a point has {len(point)} values for {len(signs)} objectives: {list(point)}"
            )
        values = tuple(sign * float(value) for sign, value in zip(signs, point, strict=True))
        if any(math.isnan(value) for value in values):
            raise ValueError(f"a point has a NaN value: {list(point)}")
        converted.append(values)
    return converted


def dominates(a: Point, b: Point, directions: Sequence[Direction]) -> bool:
    """Whether ``a`` is at least as good as ``b`` in every objective and better in one.

    Example:
        >>> dominates((0.9, 10.0), (0.8, 10.0), ["maximize", "minimize"])
        True
        >>> dominates((0.9, 10.0), (0.9, 10.0), ["maximize", "minimize"])
        False
    """
    low_a, low_b = _minimized([a, b], directions)
    return _dominates(low_a, low_b)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


def non_dominated_fronts(
    points: Sequence[Point], directions: Sequence[Direction]
) -> list[list[int]]:
    """The indices of ``points`` by front: the first front is the Pareto front.

    Equal points share a front. Two objectives take ``O(n log n)`` (a sweep over the
    points sorted by the first, each placed in the first front whose last point does not
    dominate it); more take ``O(fronts * n^2)`` comparisons.

    Example:
        >>> non_dominated_fronts([(1, 5), (2, 5), (3, 4), (1, 5)], ["minimize", "minimize"])
        [[0, 2, 3], [1]]
    """
    low = _minimized(points, directions)
    if not low:
        return []
    front_of = _fronts_2d(low) if len(low[0]) == 2 else _fronts_general(low)
    fronts: list[list[int]] = [[] for _ in range(max(front_of) + 1)]
    for index, front in enumerate(front_of):
        fronts[front].append(index)
    return fronts


def _fronts_2d(low: list[tuple[float, ...]]) -> list[int]:
    """The front of each point of two minimized objectives."""
    # The second objective of each front's last point, non-decreasing from front to front.
    tails: list[float] = []
    lasts: list[tuple[float, ...]] = []
    front_of = [0] * len(low)
    for index in sorted(range(len(low)), key=lambda i: low[i]):
        point = low[index]
        # Fronts before it end with a point no worse in either objective: it dominates.
        front = bisect.bisect_right(tails, point[1])
        if front > 0 and lasts[front - 1] == point:
            front -= 1  # an equal point does not dominate: the same front
        if front == len(tails):
            tails.append(point[1])
            lasts.append(point)
        else:
            tails[front], lasts[front] = point[1], point
        front_of[index] = front
    return front_of


def _fronts_general(low: list[tuple[float, ...]]) -> list[int]:
    """The front of each point, by peeling off the non-dominated ones."""
    front_of = [0] * len(low)
    remaining = list(range(len(low)))
    front = 0
    while remaining:
        current = [i for i in remaining if not any(_dominates(low[j], low[i]) for j in remaining)]
        for i in current:
            front_of[i] = front
        taken = set(current)
        remaining = [i for i in remaining if i not in taken]
        front += 1
    return front_of


def crowding_distances(
    points: Sequence[Point], front: Sequence[int], directions: Sequence[Direction]
) -> dict[int, float]:
    """NSGA-II's crowding distance of each point of ``front`` (indices into ``points``).

    Per objective, the gap between a point's neighbours in the front divided by the
    front's range, summed; a front's extremes (every point at an objective's minimum or
    maximum) are infinitely far. Equal points get equal distances, and an objective
    on which the whole front is equal adds nothing (so a front of equal points ties).

    Example:
        >>> points = [(0, 4), (1, 3), (2, 2), (4, 0)]
        >>> crowding_distances(points, [0, 1, 2, 3], ["minimize", "minimize"])
        {0: inf, 1: 1.0, 2: 1.5, 3: inf}
    """
    low = _minimized(points, directions)
    distance = dict.fromkeys(front, 0.0)
    if not front:
        return distance
    for objective in range(len(low[front[0]])):
        values = sorted({low[i][objective] for i in front})
        if len(values) < 2:
            continue
        span = values[-1] - values[0]
        position = {value: at for at, value in enumerate(values)}
        for i in front:
            at = position[low[i][objective]]
            if at in (0, len(values) - 1):
                distance[i] = math.inf
            else:
                gap = (values[at + 1] - values[at - 1]) / span
                # An infinite value makes the span infinite: the gap says nothing then.
                distance[i] += gap if math.isfinite(gap) else 0.0
    return distance


def rank_keys(points: Sequence[Point], directions: Sequence[Direction]) -> list[tuple[int, float]]:
    """Each point's place in a rung's order, smaller first: its front, then the negated
    crowding distance within that front. Equal keys are ties.

    Example:
        >>> rank_keys([(0, 4), (1, 3), (2, 2), (4, 0), (3, 3)], ["minimize", "minimize"])
        [(0, -inf), (0, -1.0), (0, -1.5), (0, -inf), (1, 0.0)]
    """
    keys: list[tuple[int, float]] = [(0, 0.0)] * len(points)
    for number, front in enumerate(non_dominated_fronts(points, directions)):
        for index, distance in crowding_distances(points, front, directions).items():
            keys[index] = (number, -distance or 0.0)
    return keys


def ranked_ahead(points: Sequence[Point], directions: Sequence[Direction], index: int) -> int:
    """How many of ``points`` rank strictly ahead of ``points[index]``.

    Example:
        >>> ranked_ahead([(3,), (1,), (3,), (2,)], ["minimize"], 0)
        2
    """
    keys = rank_keys(points, directions)
    return sum(key < keys[index] for key in keys)


def promoted(
    points: Sequence[Point],
    directions: Sequence[Direction],
    index: int,
    reduction_factor: int,
) -> bool:
    """Whether ``points[index]`` is in the top ``1 / reduction_factor`` of a rung of ``points``.

    ``points`` are every trial's values at the rung, this one's included. At least one
    trial is promotable (ASHA promotes the best of the first few trials at a rung, which
    cannot wait for the rest), and ties with the last promotable place are promoted.

    Example:
        >>> [promoted([(3,), (1,), (3,), (2,)], ["minimize"], i, 2) for i in range(4)]
        [False, True, False, True]
    """
    if reduction_factor < 2:
        raise ValueError(f"reduction_factor ({reduction_factor}) must be at least 2")
    places = max(1, len(points) // reduction_factor)
    return ranked_ahead(points, directions, index) < places


def pareto_front(points: Sequence[Point], directions: Sequence[Direction]) -> list[int]:
    """The indices of the points no other point dominates (in the order given).

    Example:
        >>> pareto_front([(0.9, 50.0), (0.8, 20.0), (0.7, 30.0)], ["maximize", "minimize"])
        [0, 1]
    """
    fronts = non_dominated_fronts(points, directions)
    return sorted(fronts[0]) if fronts else []


def hypervolume_2d(
    points: Sequence[Point], directions: Sequence[Direction], reference: Point
) -> float:
    """The area of objective space the points dominate, bounded by ``reference``.

    Two objectives only. ``reference`` is in the objectives' own units and directions
    (a worst acceptable value of each); points not strictly better than it in both
    objectives add nothing. The usual measure of a front's quality: it grows when a
    point is added beyond the front and with the front's spread.

    Example:
        >>> hypervolume_2d([(0.9, 50.0), (0.8, 20.0)], ["maximize", "minimize"], (0.5, 100.0))
        29.0
    """
    if len(directions) != 2:
        raise ValueError(f"hypervolume_2d: two objectives, not {len(directions)}")
    (ref_x, ref_y), *low = _minimized([reference, *points], directions)
    inside = [point for point in low if point[0] < ref_x and point[1] < ref_y]
    area = 0.0
    ceiling = ref_y
    # The front sorted by the first objective: its second falls from point to point.
    for x, y in sorted(inside):
        if y < ceiling:
            area += (ref_x - x) * (ceiling - y)
            ceiling = y
    return area
