"""The managed loop run in this process as a single rank, against a real SQLite database.

One rank needs no process group, so these run in well under a second each; the
two-rank behaviour (DDP, all-reduce, broadcast) is in ``test_distributed.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from sqlalchemy import select

from storage import (
    Checkpoint,
    CheckpointState,
    Metric,
    MetricKind,
    Trial,
    optuna_storage,
    optuna_trial_id,
    record_metrics,
    session_scope,
)
from trials.runtime import InvalidTrialError
from trials.runtime._checkpoint import read_checkpoint
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial

from .conftest import TrialHandle

SINGLE = DistributedInfo()
QUIET = {"profiling": {"enabled": False}}


def run(handle: TrialHandle) -> str:
    return run_trial(handle.spec, SINGLE)


def metric_series(
    db_url: str, trial_id: int, name: str, kind: MetricKind = MetricKind.TRAINING
) -> dict[int, float]:
    with session_scope(db_url) as session:
        rows = session.scalars(
            select(Metric).where(
                Metric.trial_id == trial_id, Metric.name == name, Metric.kind == kind
            )
        )
        return {row.step: row.value for row in rows}


def trial_row(db_url: str, trial_id: int) -> Trial:
    with session_scope(db_url) as session:
        row = session.get(Trial, trial_id)
        assert row is not None
        return row


def checkpoints(db_url: str, trial_id: int) -> list[Checkpoint]:
    with session_scope(db_url) as session:
        return list(
            session.scalars(
                select(Checkpoint).where(Checkpoint.trial_id == trial_id).order_by(Checkpoint.step)
            )
        )


def final_weight(db_url: str, trial_id: int) -> torch.Tensor:
    latest = [c for c in checkpoints(db_url, trial_id) if c.state == CheckpointState.COMPLETED][-1]
    return read_checkpoint(latest.path)["models"][0]["weight"]


def test_preempted_trial_resumes_mid_epoch_on_the_same_trajectory(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> None:
    common: dict[str, Any] = {
        "max_length": {"batches": 20},  # 16 batches per epoch: the resume is mid-epoch
        "min_validation_period": {"batches": 8},
        "slots_per_trial": 1,
        **QUIET,
    }
    reference = make_trial(hparams={"global_batch_size": 4}, **common)
    assert run(reference) == "finished"

    interrupted = make_trial(hparams={"global_batch_size": 4, "preempt_at_step": 5}, **common)
    assert run(interrupted) == "preempted"
    row = trial_row(interrupted.db_url, interrupted.spec.trial_id)
    assert row.finished_at is None and row.pruned_at is None
    (latest,) = [c for c in checkpoints(interrupted.db_url, interrupted.spec.trial_id)]
    # Rank 0 learns of the request with a record it commits, so a report or two later.
    stopped_at = latest.step
    assert 5 < stopped_at < 16
    state = read_checkpoint(latest.path)
    assert (state["epoch_idx"], state["batch_in_epoch"]) == (0, stopped_at)

    resumed = interrupted.with_changes(attempt=1, restore_checkpoint_path=latest.path)
    assert run(resumed) == "finished"

    expected = metric_series(reference.db_url, reference.spec.trial_id, "loss")
    assert sorted(expected) == list(range(1, 21))
    assert metric_series(resumed.db_url, resumed.spec.trial_id, "loss") == expected
    assert metric_series(
        resumed.db_url, resumed.spec.trial_id, "val_loss", MetricKind.VALIDATION
    ) == (
        metric_series(reference.db_url, reference.spec.trial_id, "val_loss", MetricKind.VALIDATION)
    )
    # The restored model and optimizer are those the uninterrupted run had at step 6.
    digests = {}
    for handle, attempt in ((reference, 0), (resumed, 1)):
        lines = (
            (Path(handle.spec.scratch_dir) / "rank-0" / f"digests-attempt{attempt}.jsonl")
            .read_text()
            .splitlines()
        )
        digests[attempt] = {d["step"]: d for d in map(json.loads, lines)}
    assert min(digests[1]) == stopped_at
    assert digests[1][stopped_at] == digests[0][stopped_at]
    row = trial_row(resumed.db_url, resumed.spec.trial_id)
    assert row.finished_at is not None and row.total_batches == 20


@pytest.mark.parametrize("average", [True, False])
def test_aggregated_gradients_equal_one_step_on_the_larger_batch(
    make_trial: Callable[..., TrialHandle], average: bool
) -> None:
    linear = {"linear": True, "momentum": 0.0, "lr": 0.1}
    aggregated = make_trial(
        hparams={"global_batch_size": 4, **linear},
        max_length={"batches": 4},
        optimizations={"aggregation_frequency": 4, "average_aggregated_gradients": average},
        slots_per_trial=1,
        **QUIET,
    )
    # Without averaging the step follows the sum of the 4 batch gradients: 4x the mean.
    big_lr = 0.1 if average else 0.4
    big = make_trial(
        hparams={"global_batch_size": 16, **linear, "lr": big_lr},
        max_length={"batches": 1},
        slots_per_trial=1,
        **QUIET,
    )
    assert run(aggregated) == run(big) == "finished"
    initial = torch.nn.Linear(4, 1, bias=False)
    torch.manual_seed(1)  # the trials' seed: both start from the same weights
    initial.reset_parameters()
    after_k4, after_big = (
        final_weight(aggregated.db_url, aggregated.spec.trial_id),
        final_weight(big.db_url, big.spec.trial_id),
    )
    torch.testing.assert_close(after_k4, after_big, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(after_k4, initial.weight.detach())  # a step did happen


def test_synthetic_data_trains_on_the_first_batch_again_and_again(
    make_trial: Callable[..., TrialHandle],
) -> None:
    """``profiling.synthetic_data``: four batches aggregated into one step are the first
    batch four times, so the step equals one step on the first batch alone."""
    linear = {"global_batch_size": 4, "linear": True, "momentum": 0.0, "lr": 0.1}
    synthetic = make_trial(
        hparams=linear,
        max_length={"batches": 4},
        optimizations={"aggregation_frequency": 4},
        slots_per_trial=1,
        profiling={"enabled": True, "synthetic_data": True},
    )
    first_only = make_trial(hparams=linear, max_length={"batches": 1}, slots_per_trial=1, **QUIET)
    assert run(synthetic) == run(first_only) == "finished"
    torch.testing.assert_close(
        final_weight(synthetic.db_url, synthetic.spec.trial_id),
        final_weight(first_only.db_url, first_only.spec.trial_id),
        rtol=1e-6,
        atol=1e-7,
    )


def test_mixed_precision_on_this_cpu_against_float32(
    make_trial: Callable[..., TrialHandle], recwarn: pytest.WarningsRecorder
) -> None:
    from trials.runtime._precision import resolve_mixed_precision

    losses = {}
    for mode in ("none", "bf16", "fp16"):
        handle = make_trial(
            max_length={"batches": 6},
            optimizations={"mixed_precision": mode},
            slots_per_trial=1,
            **QUIET,
        )
        assert run(handle) == "finished"
        losses[mode] = metric_series(handle.db_url, handle.spec.trial_id, "loss")
    for mode in ("bf16", "fp16"):
        plan = resolve_mixed_precision(mode, torch.device("cpu"))  # type: ignore[arg-type]
        if plan.enabled:
            assert losses[mode] != losses["none"]
            assert losses[mode] == pytest.approx(losses["none"], rel=5e-2)
        else:
            assert losses[mode] == losses["none"]  # a no-op...
            assert any(plan.warning == str(w.message) for w in recwarn)  # ...that says so


def test_epoch_lengths_report_epochs_to_optuna_and_fill_the_trial_row(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        max_length={"epochs": 2},
        min_validation_period={"epochs": 1},
        slots_per_trial=1,
        profiling={"window_batches": 5, "system_metrics_interval_s": 60},
    )
    assert run(handle) == "finished"
    study = optuna.load_study(
        study_name=handle.spec.study_name, storage=optuna_storage(handle.db_url)
    )
    frozen = next(
        t
        for t in study.trials
        if optuna_trial_id(handle.db_url, handle.spec.study_name, t.number)
        == handle.spec.optuna_trial_id
    )
    val = metric_series(handle.db_url, handle.spec.trial_id, "val_loss", MetricKind.VALIDATION)
    assert sorted(val) == [8, 16]  # 64 samples / batches of 8
    assert frozen.intermediate_values == {1: val[8], 2: val[16]}
    assert frozen.state == optuna.trial.TrialState.RUNNING  # the driver tells, not the runtime
    row = trial_row(handle.db_url, handle.spec.trial_id)
    assert (row.total_batches, row.searcher_metric_value) == (16, val[16])
    assert row.finished_at is not None and row.pruned_at is None
    from storage import Timing

    with session_scope(handle.db_url) as session:
        windows = {(t.name, t.start_step, t.end_step) for t in session.scalars(select(Timing))}
    for phase in (
        "dataloader_next",
        "to_device",
        "train_batch",
        "step_lr_schedulers",
        "reduce_metrics",
        "from_device",
    ):
        assert {(phase, 0, 5), (phase, 5, 10), (phase, 10, 15)} <= windows
    assert ("train_batch", 15, 16) in windows


def test_core_api_resumes_from_its_own_checkpoint(make_trial: Callable[..., TrialHandle]) -> None:
    handle = make_trial(entrypoint="runtime_trials:core_main", slots_per_trial=1, **QUIET)
    assert run(handle) == "finished"
    (first,) = checkpoints(handle.db_url, handle.spec.trial_id)
    assert (first.step, first.metrics) == (3, {"val_loss": 10.0})
    # What a crashed attempt would have left past the checkpoint: forgotten on restore.
    with session_scope(handle.db_url) as session:
        record_metrics(session, handle.spec.trial_id, 9, MetricKind.TRAINING, {"loss": -1.0})
    again = handle.with_changes(attempt=1, restore_checkpoint_path=first.path)
    assert run(again) == "finished"
    seen = json.loads((Path(handle.spec.scratch_dir) / "rank-0" / "core.json").read_text())
    assert seen == {"start": 3, "weight": [3.0, 3.0, 3.0], "rank": 0}
    assert metric_series(handle.db_url, handle.spec.trial_id, "loss") == {
        s: float(s) for s in range(1, 7)
    }
    assert trial_row(handle.db_url, handle.spec.trial_id).total_batches == 6


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"entrypoint": "nowhere:Trial"},
            "entrypoint: no module 'nowhere' in the model directory",
        ),
        (
            {"entrypoint": "runtime_trials:Missing"},
            "entrypoint: module 'runtime_trials' has no 'Missing'",
        ),
        (
            {"entrypoint": "runtime_trials:SINGLE_VALUE"},
            "must be a PyTorchTrial subclass or a callable",
        ),
        (
            {"searcher_metric": "val_acc"},
            "searcher.metric: 'val_acc' is not among the validation metrics \\(val_loss, val_rank_value\\)",
        ),
        ({"hparams": {"lr": 0.1}}, "hyperparameters.global_batch_size: required"),
    ],
)
def test_trials_that_cannot_run_fail_with_one_clear_line(
    make_trial: Callable[..., TrialHandle], changes: dict[str, Any], message: str
) -> None:
    handle = make_trial(slots_per_trial=1, **QUIET, **changes)
    with pytest.raises(InvalidTrialError, match=message):
        run(handle)
    assert trial_row(handle.db_url, handle.spec.trial_id).finished_at is None
