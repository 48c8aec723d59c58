"""The suite's own set-up: tests sharing a costly session fixture run on one worker.

``tests/conftest.py`` marks them with ``xdist_group`` and ``.ci/test`` runs
``--dist loadgroup``; if the mark stops reaching pytest-xdist's scheduler (as it did
under pytest 9, whose nodes keep their id where xdist does not look), every worker
builds its own Slurm and Ray cluster and real search, silently, and CI takes far longer.
"""

from __future__ import annotations

import pytest


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
