"""Leaving the process group: left for every peer, never destroyed in a rank.

torch's gloo group joins its worker threads in its destructor while holding the GIL;
a worker still releasing a finished collective's tensors needs the GIL, so a rank
whose group was destroyed right after a collective deadlocked (rank 1 after a trial's
last checkpoint: ``trials.runtime._distributed.destroy_process_group``). In-process,
on a one-rank gloo group.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from trials.runtime import _distributed
from trials.runtime._distributed import destroy_process_group, gather_to_chief


@pytest.fixture
def one_rank_group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    group = dist.group.WORLD
    assert group is not None
    try:
        yield group
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # This test process goes on: the group it kept is released here, idle.
        _distributed._LEFT_GROUPS[:] = [
            kept for kept in _distributed._LEFT_GROUPS if kept is not group
        ]


def test_a_left_group_is_kept_alive_until_the_process_ends(
    one_rank_group: dist.ProcessGroup,
) -> None:
    # A collective just before leaving, as a trial's last checkpoint gathers.
    assert gather_to_chief({"rank": 0}) == [{"rank": 0}]
    destroy_process_group()
    # Left: torch no longer knows a group, and a new one could be joined.
    assert not dist.is_initialized()
    # Not destroyed: this process still holds it, so no destructor (and no join of
    # its worker threads) runs before the rank's os._exit.
    assert any(kept is one_rank_group for kept in _distributed._LEFT_GROUPS)
    assert one_rank_group.size() == 1
