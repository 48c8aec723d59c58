from __future__ import annotations

import datetime
import hashlib
import json
import pickle
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trials import CheckpointCorruptedError, store_for, trial_checkpoint_dir
from trials.checkpoint_storage import MANIFEST_FILE
from trials.runtime._checkpoint import (
    METADATA_FILE,
    STATE_FILE,
    CheckpointMismatchError,
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
    """Every optimizer and schedule the hparams can choose survives a checkpoint: a fresh
    optimizer and fresh schedulers that load it hold exactly the saved state, and step on
    exactly as the saved ones do."""
    from trials.runtime import build_lr_scheduler, build_optimizer

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, list[Any]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = build_optimizer(
            model.parameters(),
            {"optimizer": optimizer, "lr": 0.1},
            global_batch_size=64,
            world_size=2,
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
        return model, opt, schedulers

    def train(model: torch.nn.Module, opt: torch.optim.Optimizer, schedulers: list[Any]) -> None:
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        for scheduler in schedulers:
            scheduler.step()

    model, opt, schedulers = build()
    for _ in range(2):
        train(model, opt, schedulers)
    state = {
        "models": [model.state_dict()],
        "optimizers": [opt.state_dict()],
        "lr_schedulers": [s.state_dict() for s in schedulers],
    }
    write_checkpoint(tmp_path, "c", state, {})
    loaded = read_checkpoint(tmp_path / "c")

    fresh_model, fresh_opt, fresh_schedulers = build()
    # The fresh ones differ before the load: the comparison below could fail.
    assert fresh_schedulers[0].state_dict() != schedulers[0].state_dict()
    fresh_model.load_state_dict(loaded["models"][0])
    fresh_opt.load_state_dict(loaded["optimizers"][0])
    for scheduler, saved in zip(fresh_schedulers, loaded["lr_schedulers"], strict=True):
        scheduler.load_state_dict(saved)
    _assert_same_state(fresh_opt.state_dict(), opt.state_dict())
    for restored, original in zip(fresh_schedulers, schedulers, strict=True):
        _assert_same_state(restored.state_dict(), original.state_dict())
    # And they go on alike: the same learning rates, moments and weights a step later.
    train(model, opt, schedulers)
    train(fresh_model, fresh_opt, fresh_schedulers)
    _assert_same_state(fresh_opt.state_dict(), opt.state_dict())
    torch.testing.assert_close(fresh_model.state_dict(), model.state_dict(), rtol=0, atol=0)


def _assert_same_state(actual: Any, expected: Any, where: str = "state") -> None:
    """``actual`` equals ``expected`` exactly: tensors bitwise, containers item by item."""
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=where)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            _assert_same_state(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_same_state(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


# --------------------------------------------- digests: a damaged checkpoint is never loaded


def _written(tmp_path: Path) -> Path:
    model = torch.nn.Linear(3, 2)
    path, _ = write_checkpoint(tmp_path / "t", "c1", {"models": [model.state_dict()]}, {"s": 1})
    assert isinstance(path, Path)
    return path


def test_the_manifest_records_each_files_size_and_digest_before_the_rename(
    tmp_path: Path,
) -> None:
    path = _written(tmp_path)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == sorted(manifest["sha256"]) == [METADATA_FILE, STATE_FILE]
    for name in (STATE_FILE, METADATA_FILE):
        data = (path / name).read_bytes()
        assert manifest["files"][name] == len(data)
        assert manifest["sha256"][name] == hashlib.sha256(data).hexdigest()
    store_for(str(path)).verify(str(path))  # intact


def _truncate(file: Path, size: int) -> None:
    with open(file, "r+b") as f:
        f.truncate(size)


def _flip_a_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: _truncate(p / STATE_FILE, 64), r"^state\.pt: 64 bytes, its manifest says \d+$"),
        (lambda p: _flip_a_byte(p / STATE_FILE), "^state.pt: its SHA-256 digest differs"),
        (lambda p: (p / STATE_FILE).unlink(), "^state.pt is missing .its manifest names it.$"),
        (lambda p: (p / METADATA_FILE).unlink(), "^metadata.json is missing"),
        (lambda p: _flip_a_byte(p / METADATA_FILE), "^metadata.json: its SHA-256 digest"),
        (lambda p: (p / MANIFEST_FILE).write_text("{not json"), "^MANIFEST.json cannot be read$"),
    ],
    ids=[
        "truncated",
        "altered",
        "state-missing",
        "metadata-missing",
        "metadata-altered",
        "bad-manifest",
    ],
)
def test_a_damaged_checkpoint_is_refused_before_torch_load_naming_the_file(
    tmp_path: Path, damage: Callable[[Path], None], problem: str
) -> None:
    path = _written(tmp_path)
    damage(path)
    with pytest.raises(CheckpointCorruptedError) as raised:
        read_checkpoint(path)
    assert re.search(problem, raised.value.problem), raised.value.problem
    assert str(raised.value) == f"checkpoint {path}: {raised.value.problem}"
    assert "\n" not in str(raised.value)
    with pytest.raises(CheckpointCorruptedError):
        store_for(str(path)).verify(str(path))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda f: _truncate(f, 64), "PytorchStreamReader failed reading zip archive"),
        # Not a zip: torch reads it as its legacy format, whose unpickler refuses it.
        (lambda f: f.write_bytes(b"xx"), "Weights only load failed: Unsupported operand 120"),
    ],
    ids=["truncated", "garbage"],
)
def test_a_checkpoint_without_digests_is_damaged_when_torch_cannot_read_it(
    tmp_path: Path, damage: Callable[[Path], None], reason: str
) -> None:
    """Written before manifests existed: nothing to compare with, so what torch.load says
    decides (a truncated zip, or bytes that are no checkpoint, are damage)."""
    path = _written(tmp_path)
    (path / MANIFEST_FILE).unlink()
    assert read_checkpoint(path).keys() == {"models"}
    damage(path / STATE_FILE)
    with pytest.raises(CheckpointCorruptedError) as raised:
        read_checkpoint(path)
    assert raised.value.problem.startswith(f"state.pt cannot be read by torch.load: {reason}")
    assert "\n" not in str(raised.value)


def test_intact_bytes_that_weights_only_refuses_are_no_corruption(tmp_path: Path) -> None:
    """A file that matches its digest is what was written: torch refusing it is about
    the code, never about the storage, so it is not skipped as damaged."""
    path, _ = write_checkpoint(tmp_path, "unsafe", {"when": datetime.timedelta(1)}, {})
    with pytest.raises(CheckpointMismatchError) as e:
        read_checkpoint(path)
    assert str(e.value) == (
        f"checkpoint {path}: torch.load(weights_only=True) refuses state.pt: Weights only "
        "load failed: Unsupported global: GLOBAL datetime.timedelta was not an allowed global "
        "by default"
    )
    assert not isinstance(e.value, CheckpointCorruptedError)
