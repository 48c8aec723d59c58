"""The suite's own set-up: tests sharing a costly session fixture run on one worker.

``tests/conftest.py`` marks them with ``xdist_group`` and ``.ci/test`` runs
``--dist loadgroup``; if the mark stops reaching pytest-xdist's scheduler (as it did
under pytest 9, whose nodes keep their id where xdist does not look), every worker
builds its own Slurm and Ray cluster and real search, silently, and CI takes far longer.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import group_ended, released_after_group


@pytest.mark.xdist_group("grouping-check")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run on an xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), request.node.nodeid


def test_a_test_grouped_by_its_fixture_carries_its_group(
    request: pytest.FixtureRequest, grouping_probe: None
) -> None:
    # tests/conftest.py marks tests by the fixtures they use: xdist only sees such a mark
    # if that hook runs before its own (otherwise every worker built its own clusters).
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run on an xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), request.node.nodeid


def _items(fixtures: list[str], *, loadgroup: bool) -> list[Any]:
    """Stand-ins for collected tests, one per fixture name ("" for none), in run order."""
    session = SimpleNamespace(items=[])
    config = SimpleNamespace(option=SimpleNamespace(loadgroup=loadgroup))
    session.items = [
        SimpleNamespace(fixturenames=[f] if f else [], config=config, session=session)
        for f in fixtures
    ]
    return list(session.items)


def test_a_group_ends_after_its_last_test_on_a_loadgroup_worker() -> None:
    # A worker's tests are not the session's order there: a group's come together.
    first, last, other = _items(["ray_cluster", "ray_postgres", ""], loadgroup=True)
    assert group_ended(first, last) is None
    assert group_ended(last, other) == "ray"
    assert group_ended(last, None) == "ray"
    assert group_ended(other, None) is None


def test_without_xdist_a_group_ends_only_after_its_last_test_in_the_session() -> None:
    # Without xdist the group's tests may be spread over the run: the cluster stays up.
    ray, slurm, later_ray = _items(
        ["ray_cluster", "slurm_cluster", "ray_cluster"], loadgroup=False
    )
    assert group_ended(ray, slurm) is None
    assert group_ended(slurm, later_ray) == "slurm"
    assert group_ended(later_ray, None) == "ray"


def test_a_released_resource_is_released_once() -> None:
    released: list[str] = []
    release = released_after_group("grouping-check", lambda: released.append("x"))
    release()
    release()
    assert released == ["x"]
