from __future__ import annotations

import math

import pytest
import torch

from trials.runtime._metrics import MetricAccumulator, check_scalar, reduce_means, unpack_means


def test_scalars_are_numbers_or_one_element_tensors() -> None:
    assert check_scalar("loss", 2) == 2.0
    value = check_scalar("loss", torch.tensor([1.5], requires_grad=True))
    assert isinstance(value, torch.Tensor) and value.shape == () and not value.requires_grad
    with pytest.raises(TypeError, match=r"metric 'loss': must be a scalar.*shape \(2,\)"):
        check_scalar("loss", torch.zeros(2))
    with pytest.raises(TypeError, match=r"metric 'name': must be a scalar.*str"):
        check_scalar("name", "x")
    with pytest.raises(TypeError, match="must be a scalar"):
        check_scalar("flag", True)


def test_accumulator_means_over_batches_mixing_tensors_and_floats() -> None:
    acc = MetricAccumulator()
    acc.add({"loss": torch.tensor(1.0), "lr": 0.1})
    acc.add({"loss": torch.tensor(3.0), "lr": 0.3})
    packed = reduce_means(acc.sums(torch.device("cpu")), acc.weight)
    means, weight, extras = unpack_means(acc.names(), packed.tolist())
    assert means == pytest.approx({"loss": 2.0, "lr": 0.2})
    assert weight == 2.0 and extras == []


def test_weighted_accumulation_is_a_sample_mean() -> None:
    acc = MetricAccumulator()
    acc.add({"acc": 1.0}, weight=3.0)  # a batch of 3, all right
    acc.add({"acc": 0.0}, weight=1.0)  # a batch of 1, wrong
    means, _, _ = unpack_means(
        acc.names(), reduce_means(acc.sums(torch.device("cpu")), acc.weight).tolist()
    )
    assert means == {"acc": 0.75}


def test_a_rank_that_does_not_contribute_adds_zeros_but_keeps_the_extras() -> None:
    acc = MetricAccumulator()
    acc.add({"loss": 5.0})
    packed = reduce_means(
        acc.sums(torch.device("cpu")), acc.weight, contribute=False, extras=(1.0,)
    )
    assert packed.tolist() == [0.0, 0.0, 1.0]
    means, weight, extras = unpack_means(["loss"], packed.tolist())
    assert math.isnan(means["loss"]) and weight == 0.0 and extras == [1.0]


def test_non_dict_results_are_a_clear_error() -> None:
    with pytest.raises(TypeError, match="must return a dict of scalar metrics, got Tensor"):
        MetricAccumulator().add(torch.tensor(1.0))  # type: ignore[arg-type]


def test_reset_forgets_everything() -> None:
    acc = MetricAccumulator()
    acc.add({"loss": 1.0})
    acc.reset()
    assert not acc and acc.names() == []
