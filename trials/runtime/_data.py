"""Data loaders whose sharding and resumption the platform owns.

A trial describes its loader with :class:`DataLoader` (the dataset and the usual
``torch.utils.data.DataLoader`` options, never a sampler); the runtime builds the real
loader with a :class:`ResumableDistributedSampler` for training, so each rank sees its
own shard, the shuffle order is the same function of (seed, epoch) on every attempt,
and a restored trial continues mid-epoch. Validation shards the data without padding,
so every sample counts exactly once in the averaged validation metrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, Sampler


class DataLoader:
    """What a trial returns from ``build_training_data_loader`` and ``build_validation_data_loader``.

    ``batch_size`` defaults to ``context.per_slot_batch_size``. The other arguments are
    those of ``torch.utils.data.DataLoader``; ``sampler`` and ``batch_sampler`` are the
    platform's, so they are not accepted.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4, shuffle=True)
        >>> loader.shuffle
        True
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                "DataLoader: an IterableDataset cannot be sharded or resumed by the platform; "
                "use a map-style Dataset (one with __len__ and __getitem__)"
            )
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise ValueError(
                f"DataLoader: batch_size must be a positive integer, got {batch_size!r}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor

    def build(
        self, sampler: Sampler[int], batch_size: int, generator: torch.Generator
    ) -> torch.utils.data.DataLoader[Any]:
        """The real loader over ``sampler``; ``generator`` seeds workers, not the global RNG."""
        kwargs: dict[str, Any] = {}
        if self.num_workers > 0 and self.prefetch_factor is not None:
            kwargs["prefetch_factor"] = self.prefetch_factor
        return torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size or batch_size,
            sampler=sampler,
            drop_last=self.drop_last,
            num_workers=self.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=self.pin_memory,
            worker_init_fn=self.worker_init_fn,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            # Without its own generator the loader draws its worker seed from the global
            # RNG at every epoch start, which would make a mid-epoch restore diverge.
            generator=generator,
            **kwargs,
        )


class ResumableDistributedSampler(DistributedSampler[Any]):
    """``DistributedSampler`` that can start an epoch part-way through this rank's shard.

    Example:
        >>> s = ResumableDistributedSampler(list(range(8)), num_replicas=2, rank=0, shuffle=False)
        >>> s.set_start_index(2)
        >>> list(s)
        [4, 6]
    """

    def __init__(
        self,
        dataset: Any,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.start_index = 0

    def set_start_index(self, start_index: int) -> None:
        """Skip the first ``start_index`` samples of this rank's shard in the next epoch."""
        if start_index < 0:
            raise ValueError(f"start_index must be >= 0, got {start_index}")
        self.start_index = start_index

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_index)


class ShardSampler(Sampler[int]):
    """Every ``num_replicas``-th index from ``rank``, in order, with no padding.

    Example:
        >>> list(ShardSampler(5, num_replicas=2, rank=1))
        [1, 3]
    """

    def __init__(self, length: int, *, num_replicas: int, rank: int) -> None:
        self.indices = range(rank, length, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def batch_sizes(num_samples: int, batch_size: int, drop_last: bool) -> list[int]:
    """The size of each batch a loader makes from ``num_samples`` samples.

    Example:
        >>> batch_sizes(10, 4, drop_last=False)
        [4, 4, 2]
    """
    full, rest = divmod(num_samples, batch_size)
    return [batch_size] * full + ([rest] if rest and not drop_last else [])


def batches_per_epoch(
    num_samples: int, *, world_size: int, batch_size: int, drop_last: bool = False
) -> int:
    """Batches each rank trains per epoch, as the platform's training loader makes them.

    The training sampler pads the data set to a multiple of ``world_size`` (as
    ``DistributedSampler`` does), so every rank runs the same number of batches.

    Example:
        >>> batches_per_epoch(1437, world_size=2, batch_size=32)
        23
    """
    per_rank = math.ceil(num_samples / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
