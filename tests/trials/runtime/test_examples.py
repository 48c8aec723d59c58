"""The examples' trials (``examples/digits``, ``examples/charlm``) in this process, as one
rank against a real database: they learn, and a trial stopped mid-epoch and restored from
its checkpoint records exactly the metrics of the same trial run without a stop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from sqlalchemy import select, update

from storage import Checkpoint, Metric, MetricKind, TrialRun, session_scope, utcnow
from trials.runtime import read_checkpoint
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial

from .conftest import REPO_ROOT, TrialHandle

pytestmark = pytest.mark.slow  # each trains a real model for a few seconds

EXAMPLES = REPO_ROOT / "examples"


@dataclass(frozen=True)
class Example:
    """One example's trial, small: its class, hyperparameters, data and epoch length."""

    folder: str
    cls: str
    hparams: dict[str, Any]
    data: dict[str, Any]
    batches_per_epoch: int


EXAMPLE_TRIALS = {
    # 1,437 training images in batches of 64: 23 batches an epoch.
    "digits": Example(
        "digits",
        "DigitsTrial",
        {
            "global_batch_size": 64,
            "lr": 0.05,
            "lr_scaling": "linear",
            "reference_batch_size": 64,
            "warmup_epochs": 1,
            "optimizer": "sgd",
            "dropout": 0.1,
        },
        {},
        23,
    ),
    # 32,768 characters in windows of 64: 511 windows, 16 batches of 32 an epoch.
    "charlm": Example(
        "charlm",
        "CharLMTrial",
        {
            "global_batch_size": 32,
            "lr": 0.01,
            "lr_scaling": "linear",
            "reference_batch_size": 32,
            "warmup_steps": 6,
            "lr_decay": "cosine",
            "optimizer": "adamw",
            "weight_decay": 0.01,
            "n_layer": 2,
            "n_embd": 64,
            "head_size": 32,
            "block_size": 64,
            "dropout": 0.1,
        },
        {"train_chars": 32768, "val_windows": 16},
        16,
    ),
}


@pytest.fixture(autouse=True)
def as_a_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a trial's rank: a fresh ``model`` module and one thread.

    Every example's module is named ``model``: one imported by an earlier test (of
    another example) would be found instead, and this test's must not stay behind. A
    rank computes on one thread (``OMP_NUM_THREADS=1``, trials.launch.launcher); two
    on a loaded machine of two cores wait on each other many times a batch.
    """
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("model", None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    sys.modules.pop("model", None)


def _metrics(handle: TrialHandle) -> dict[tuple[MetricKind, str, int], Any]:
    with session_scope(handle.db_url) as session:
        rows = session.scalars(select(Metric).where(Metric.trial_id == handle.spec.trial_id))
        return {(r.kind, r.name, r.step): r.value for r in rows}


def test_digits_trial_learns_with_the_recipe_helpers(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        entrypoint="model:DigitsTrial",
        model_dir=str(EXAMPLES / "digits"),
        hparams={
            "global_batch_size": 64,
            "lr": 0.05,
            "lr_scaling": "linear",
            "reference_batch_size": 64,
            "warmup_epochs": 1,
            "optimizer": "sgd",
        },
        slots_per_trial=1,
        max_length={"epochs": 3},
        min_validation_period={"epochs": 1},
        profiling={"enabled": False},
    )
    assert run_trial(handle.spec, DistributedInfo()) == "finished"
    values = _metrics(handle)
    # 1437 training images in batches of 64: 23 batches per epoch.
    accuracy = [values[(MetricKind.VALIDATION, "val_accuracy", step)] for step in (23, 46, 69)]
    losses = [values[(MetricKind.VALIDATION, "val_loss", step)] for step in (23, 46, 69)]
    assert losses[-1] < losses[0] and accuracy[-1] > 0.8
    # Warmup: the recorded learning rate rises during the first epoch.
    assert values[(MetricKind.TRAINING, "lr", 23)] < values[(MetricKind.TRAINING, "lr", 46)]


@pytest.mark.parametrize("name", sorted(EXAMPLE_TRIALS))
def test_an_example_trial_restored_mid_epoch_records_the_same_metrics(
    name: str, make_trial: Callable[..., TrialHandle]
) -> None:
    example = EXAMPLE_TRIALS[name]
    # Into the second epoch; a validation at the middle of each epoch and at the end.
    batches = example.batches_per_epoch + 4
    common: dict[str, Any] = {
        "entrypoint": f"model:{example.cls}",
        "model_dir": str(EXAMPLES / example.folder),
        "data": example.data,
        "slots_per_trial": 1,
        "max_length": {"batches": batches},
        "min_validation_period": {"batches": example.batches_per_epoch // 2},
        # Frequent records: a stop asked before the start is seen well before the epoch ends.
        "min_checkpoint_period": {"batches": 3},
        "profiling": {"enabled": False},
    }
    reference = make_trial(hparams=example.hparams, **common)
    assert run_trial(reference.spec, DistributedInfo()) == "finished"

    # The driver's pause, asked as the first attempt starts: it checkpoints and stops at a
    # record after its first batches (rank 0 learns of it through a record it commits).
    stopped = make_trial(hparams=example.hparams, **common)
    with session_scope(stopped.db_url) as session:
        session.execute(
            update(TrialRun)
            .where(TrialRun.trial_id == stopped.spec.trial_id)
            .values(stop_requested_at=utcnow())
        )
    assert run_trial(stopped.spec, DistributedInfo()) == "preempted"
    with session_scope(stopped.db_url) as session:
        latest = session.scalars(
            select(Checkpoint)
            .where(Checkpoint.trial_id == stopped.spec.trial_id)
            .order_by(Checkpoint.step.desc())
        ).first()
    assert latest is not None
    state = read_checkpoint(latest.path)
    # Within the first epoch: the restore starts part-way through it.
    assert state["epoch_idx"] == 0 and 0 < state["batch_in_epoch"] < example.batches_per_epoch

    resumed = stopped.with_changes(attempt=1, restore_checkpoint_path=latest.path)
    assert run_trial(resumed.spec, DistributedInfo()) == "finished"
    expected = _metrics(reference)
    assert (MetricKind.VALIDATION, "val_loss", batches) in expected
    assert _metrics(resumed) == expected
