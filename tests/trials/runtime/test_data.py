from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler, IterableDataset, TensorDataset

from trials.runtime._data import (
    DataLoader,
    ResumableDistributedSampler,
    ShardSampler,
    batch_sizes,
    batches_per_epoch,
)


def test_resumed_sampler_continues_the_same_shuffled_order() -> None:
    data = list(range(50))
    full = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    full.set_epoch(4)
    order = list(full)
    resumed = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    resumed.set_epoch(4)
    resumed.set_start_index(10)
    assert list(resumed) == order[10:]
    assert len(resumed) == len(order) - 10


def test_shards_cover_the_padded_data_set_and_differ_per_epoch() -> None:
    data = list(range(7))
    shards = []
    for rank in (0, 1):
        sampler = ResumableDistributedSampler(
            data, num_replicas=2, rank=rank, shuffle=True, seed=0
        )
        sampler.set_epoch(0)
        shards.append(list(sampler))
    assert len(shards[0]) == len(shards[1]) == 4  # padded to 8
    assert set(shards[0]) | set(shards[1]) == set(data)
    # Each epoch draws its own order, the one torch's DistributedSampler draws for it
    # (a set_epoch that did nothing would give epoch 0's again).
    for epoch in (1, 2):
        other = ResumableDistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
        other.set_epoch(epoch)
        reference = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
        reference.set_epoch(epoch)
        assert list(other) == list(reference)
        assert list(other) != shards[0]


def test_validation_shards_have_no_padding() -> None:
    shards = [list(ShardSampler(5, num_replicas=2, rank=r)) for r in (0, 1)]
    assert shards == [[0, 2, 4], [1, 3]]


def test_batch_arithmetic_matches_torch_loaders() -> None:
    assert batch_sizes(10, 4, drop_last=False) == [4, 4, 2]
    assert batch_sizes(10, 4, drop_last=True) == [4, 4]
    for n, world, bs, drop in [(1437, 2, 32, False), (1437, 3, 50, True), (7, 2, 8, False)]:
        dataset = TensorDataset(torch.zeros(n, 1))
        sampler = ResumableDistributedSampler(dataset, num_replicas=world, rank=0, shuffle=False)
        loader = DataLoader(dataset, batch_size=bs, drop_last=drop).build(
            sampler, bs, torch.Generator()
        )
        assert batches_per_epoch(n, world_size=world, batch_size=bs, drop_last=drop) == len(loader)


def test_data_loader_defaults_to_the_slot_batch_and_uses_its_own_generator() -> None:
    dataset = TensorDataset(torch.arange(12.0))
    sampler = ResumableDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(dataset).build(sampler, 5, generator)
    state = torch.get_rng_state()
    batches = [b[0].tolist() for b in loader]
    assert batches == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG was not drawn from


def test_data_loader_rejects_what_the_platform_cannot_shard() -> None:
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield 1

    with pytest.raises(TypeError, match="IterableDataset cannot be sharded"):
        DataLoader(Stream())
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        DataLoader(TensorDataset(torch.zeros(2)), batch_size=0)
