from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trials import trial_checkpoint_dir
from trials.runtime._checkpoint import (
    METADATA_FILE,
    STATE_FILE,
    capture_rng_state,
    read_checkpoint,
    restore_rng_state,
    write_checkpoint,
)


def test_layout_is_relative_to_the_model_dir_unless_absolute(tmp_path: Path) -> None:
    assert trial_checkpoint_dir("./ckpt", "/exp", "2-ab", 9) == Path("/exp/ckpt/2-ab/9")
    assert trial_checkpoint_dir(str(tmp_path), "/exp", "2-ab", 9) == tmp_path / "2-ab" / "9"
    # An experiment from before the key: its folder is its id, as it always was.
    assert trial_checkpoint_dir("./ckpt", "/exp", "2", 9) == Path("/exp/ckpt/2/9")


def test_write_is_atomic_and_loads_weights_only(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"models": [model.state_dict()], "optimizers": [opt.state_dict()], "step": 5}
    path, size = write_checkpoint(tmp_path / "t", "abc", state, {"step": 5})
    assert path == tmp_path / "t" / "abc"
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["abc"]  # no temp left
    assert size == sum(p.stat().st_size for p in path.iterdir())
    assert json.loads((path / METADATA_FILE).read_text()) == {"step": 5}
    loaded = read_checkpoint(path)
    assert read_checkpoint(path / STATE_FILE).keys() == loaded.keys()
    torch.testing.assert_close(loaded["models"][0], model.state_dict())
    assert loaded["optimizers"][0]["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises((pickle.PicklingError, AttributeError)):
        write_checkpoint(tmp_path, "bad", {"fn": lambda: 1}, {})
    assert list(tmp_path.iterdir()) == []


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^no checkpoint at .*nope$"):
        read_checkpoint(tmp_path / "nope")


def test_rng_states_survive_a_weights_only_round_trip(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in NumPy's legacy state
    state = capture_rng_state(torch.device("cpu"))
    expected = (random.random(), np.random.rand(), torch.rand(2))
    write_checkpoint(tmp_path, "rng", {"rng": [state]}, {})
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng_state(read_checkpoint(tmp_path / "rng")["rng"][0], torch.device("cpu"))
    assert random.random() == expected[0]
    assert np.random.rand() == expected[1]
    assert torch.equal(torch.rand(2), expected[2])


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw", "radam", "lars", "lamb"])
def test_the_recipe_helpers_state_loads_weights_only(tmp_path: Path, optimizer: str) -> None:
    """Every optimizer and schedule the hparams can choose survives a checkpoint."""
    from trials.runtime import build_lr_scheduler, build_optimizer

    model = torch.nn.Linear(4, 2)
    opt = build_optimizer(
        model.parameters(), {"optimizer": optimizer, "lr": 0.1}, global_batch_size=64, world_size=2
    )
    schedulers = [
        build_lr_scheduler(
            opt,
            {"warmup_epochs": 1, "lr_decay": decay, "lr_step_epochs": 1},
            steps_per_epoch=3,
            total_steps=9,
        )
        for decay in ("constant", "cosine", "step")
    ]
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    for scheduler in schedulers:
        scheduler.step()
    state = {
        "optimizers": [opt.state_dict()],
        "lr_schedulers": [s.state_dict() for s in schedulers],
    }
    write_checkpoint(tmp_path, "c", state, {})
    loaded = read_checkpoint(tmp_path / "c")
    opt.load_state_dict(loaded["optimizers"][0])
    for scheduler, saved in zip(schedulers, loaded["lr_schedulers"], strict=True):
        scheduler.load_state_dict(saved)
