"""Metric values: checked, accumulated on the device, averaged across ranks.

Training metrics stay on the device as detached tensors until a report is due, so a
batch never waits for a GPU-to-host copy; at the report all values travel in one
tensor through one all-reduce (sums and weights), and only then come to the host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trials.runtime._distributed import all_reduce_sum, on_device


def check_scalar(name: str, value: Any) -> torch.Tensor | float:
    """A metric value as a detached scalar tensor or a float; anything else is an error.

    Example:
        >>> check_scalar("loss", 0.5)
        0.5
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"metric {name!r}: must be a scalar (a number or a one-element tensor), "
                f"got a tensor of shape {tuple(value.shape)}"
            )
        value = value.detach()
        # A view op costs host time on every batch: only when the shape is not () yet.
        return value if value.dim() == 0 else value.reshape(())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"metric {name!r}: must be a scalar (a number or a one-element tensor), "
            f"got {type(value).__name__}"
        )
    return float(value)


class MetricAccumulator:
    """Sums of each metric over the batches since the last report, with their weights.

    Example:
        >>> acc = MetricAccumulator()
        >>> acc.add({"loss": 1.0}); acc.add({"loss": 3.0})
        >>> acc.names(), acc.weight
        (['loss'], 2.0)
    """

    def __init__(self) -> None:
        self._values: dict[str, list[torch.Tensor | float]] = {}
        self.weight = 0.0

    def __bool__(self) -> bool:
        return self.weight > 0

    def add(self, metrics: Mapping[str, Any] | None, weight: float = 1.0) -> None:
        """Add one batch's metrics; ``weight`` multiplies them (samples in the batch)."""
        if metrics:
            try:
                items = metrics.items()
            except AttributeError:
                raise TypeError(
                    "train_batch and evaluate_batch must return a dict of scalar metrics, "
                    f"got {type(metrics).__name__}"
                ) from None
            for name, value in items:
                scalar = check_scalar(name, value)
                values = self._values.get(name)
                item = scalar if weight == 1.0 else scalar * weight
                if values is None:
                    self._values[name] = [item]
                else:
                    values.append(item)
        self.weight += weight

    def names(self) -> list[str]:
        return sorted(self._values)

    def sums(self, device: torch.device) -> torch.Tensor:
        """One float64 tensor of the per-name sums, in :meth:`names` order."""
        out = torch.zeros(len(self._values), dtype=torch.float64, device=device)
        for i, name in enumerate(self.names()):
            values = self._values[name]
            tensors = [v for v in values if isinstance(v, torch.Tensor)]
            floats = math.fsum(v for v in values if not isinstance(v, torch.Tensor))
            total = (
                torch.stack(tensors).to(device=device, dtype=torch.float64).sum()
                if tensors
                else 0.0
            )
            out[i] = total + floats
        return out

    def reset(self) -> None:
        self._values = {}
        self.weight = 0.0


def reduce_means(
    sums: torch.Tensor,
    weight: float,
    *,
    contribute: bool = True,
    extras: Sequence[float] = (),
) -> torch.Tensor:
    """Pack ``[sums..., weight, extras...]`` and sum it over every rank, on the device.

    A rank with ``contribute=False`` adds zeros, so with only rank 0 contributing the
    result is rank 0's own values (``average_training_metrics: false``) at the cost of
    the same single collective. Extras carry control flags (a preemption request) in
    that collective, so they cost no extra round trip. :func:`unpack_means` reads the
    host copy.
    """
    if not contribute:
        sums = torch.zeros_like(sums)
        weight = 0.0
    tail = on_device([weight, *extras], sums.device)
    packed = torch.cat([sums.to(torch.float64), tail])
    return all_reduce_sum(packed)


def unpack_means(
    names: Sequence[str], packed: Sequence[float]
) -> tuple[dict[str, float], float, list[float]]:
    """``(means by name, total weight, extras)`` from a host copy of a packed tensor.

    Example:
        >>> unpack_means(["a"], [3.0, 2.0, 1.0])
        ({'a': 1.5}, 2.0, [1.0])
    """
    n = len(names)
    weight = float(packed[n])
    means = {
        name: (float(packed[i]) / weight if weight else math.nan) for i, name in enumerate(names)
    }
    return means, weight, [float(x) for x in packed[n + 1 :]]
