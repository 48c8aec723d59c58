"""A trial's seeding: the same random streams as ``torch.manual_seed``, at less cost."""

from __future__ import annotations

import random

import numpy as np
import torch

from trials.runtime._runner import _seed_everything, _seed_torch


def test_torch_is_seeded_as_torch_manual_seed_seeds_it() -> None:
    _seed_torch(1234)
    ours = (torch.rand(4), torch.randint(0, 1000, (4,)))
    torch.manual_seed(1234)
    torchs = (torch.rand(4), torch.randint(0, 1000, (4,)))
    assert torch.equal(ours[0], torchs[0]) and torch.equal(ours[1], torchs[1])
    assert torch.initial_seed() == 1234


def test_every_generator_a_trial_uses_restarts_from_the_seed() -> None:
    _seed_everything(7)
    first = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(1)  # a trial draws on
    _seed_everything(7)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == first
