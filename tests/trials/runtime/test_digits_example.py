"""The digits example trains, in this process, as one rank against a real database."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from storage import Metric, MetricKind, session_scope
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial

from .conftest import REPO_ROOT, TrialHandle

pytestmark = pytest.mark.slow  # imports scikit-learn and trains 3 epochs (a few seconds)


def test_digits_trial_learns_with_the_recipe_helpers(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> None:
    handle = make_trial(
        entrypoint="model:DigitsTrial",
        model_dir=str(REPO_ROOT / "examples" / "digits"),
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
    with session_scope(handle.db_url) as session:
        rows = session.scalars(select(Metric).where(Metric.trial_id == handle.spec.trial_id))
        values = {(r.kind, r.name, r.step): r.value for r in rows}
    # 1437 training images in batches of 64: 23 batches per epoch.
    accuracy = [values[(MetricKind.VALIDATION, "val_accuracy", step)] for step in (23, 46, 69)]
    losses = [values[(MetricKind.VALIDATION, "val_loss", step)] for step in (23, 46, 69)]
    assert losses[-1] < losses[0] and accuracy[-1] > 0.8
    # Warmup: the recorded learning rate rises during the first epoch.
    assert values[(MetricKind.TRAINING, "lr", 23)] < values[(MetricKind.TRAINING, "lr", 46)]
