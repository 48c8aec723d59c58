"""Real two-rank jobs: ``torchrun -m trials.node.worker`` (and one checks script) on gloo.

Each launch costs several seconds on two cores, so the checks share launches: one
uninterrupted reference run, one run whose rank 1 is SIGKILLed plus its restart, one
pruned run, and one script run for the checks that need ranks with different data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from sqlalchemy import select

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    Metric,
    MetricKind,
    Timing,
    Trial,
    optuna_storage,
    optuna_trial_id,
    session_scope,
    upgrade_schema,
)
from trials.runtime._checkpoint import read_checkpoint

from .conftest import FIXTURES, TrialHandle, create_trial, run_torchrun, run_worker

pytestmark = pytest.mark.slow

# 64 training samples, 2 ranks x 4 per batch: 8 batches per epoch; 12 batches in all.
COMMON: dict[str, Any] = {
    "max_length": {"batches": 12},
    "min_validation_period": {"batches": 4},
    "min_checkpoint_period": {"batches": 4},
    "profiling": {"window_batches": 4},
}


def series(
    db_url: str, trial_id: int, name: str, kind: MetricKind = MetricKind.TRAINING
) -> dict[int, float]:
    with session_scope(db_url) as session:
        rows = session.scalars(
            select(Metric).where(
                Metric.trial_id == trial_id, Metric.name == name, Metric.kind == kind
            )
        )
        return {row.step: row.value for row in rows}


def checkpoint_rows(db_url: str, trial_id: int) -> list[Checkpoint]:
    with session_scope(db_url) as session:
        return list(
            session.scalars(
                select(Checkpoint).where(Checkpoint.trial_id == trial_id).order_by(Checkpoint.step)
            )
        )


def trial_row(db_url: str, trial_id: int) -> Trial:
    with session_scope(db_url) as session:
        row = session.get(Trial, trial_id)
        assert row is not None
        return row


def digests(handle: TrialHandle, rank: int, attempt: int) -> dict[int, dict[str, Any]]:
    path = Path(handle.spec.scratch_dir) / f"rank-{rank}" / f"digests-attempt{attempt}.jsonl"
    return {d["step"]: d for d in map(json.loads, path.read_text().splitlines())}


def assert_compression_hooks(hooks: dict[str, Any], *, bf16_hook: str) -> None:
    """``dist_checks.py``'s report: buckets as configured, and each compression hook
    registered and computing what it should, against the exact cross-rank mean."""
    assert hooks["fusion_bucket_bytes_cap"] == int(3.5 * 1024 * 1024)  # tensor_fusion_threshold
    assert hooks["none"]["bucket_bytes_cap"] == 64 * 1024 * 1024  # the default threshold
    names = {"none": None, "fp16": "fp16_compress_hook", "bf16": bf16_hook}
    names |= {"powersgd": "powerSGD_hook", "powersgd_full_rank": "powerSGD_hook"}
    assert {case: hooks[case]["comm_hook"] for case in names} == names
    for compression, dtype in (("none", None), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for it in hooks[compression]["iterations"]:
            ddp, locals_ = torch.tensor(it["ddp"]), [torch.tensor(g) for g in it["locals"]]
            exact = sum(locals_) / 2
            if dtype is None:
                torch.testing.assert_close(ddp, exact, rtol=0, atol=1e-7)
            else:
                # What the hook computes: each rank's gradient / 2 in the narrow dtype, summed.
                compressed = (locals_[0].to(dtype) / 2 + locals_[1].to(dtype) / 2).float()
                torch.testing.assert_close(ddp, compressed, rtol=0, atol=1e-7)
                assert not torch.allclose(ddp, exact, rtol=0, atol=1e-7)  # the hook did compress
    for name, exact_after_warmup in (("powersgd", True), ("powersgd_full_rank", False)):
        for i, it in enumerate(hooks[name]["iterations"]):
            ddp, exact = torch.tensor(it["ddp"]), sum(torch.tensor(g) for g in it["locals"]) / 2
            if i < 2 or exact_after_warmup:
                # Plain all-reduce during warm-up; afterwards a rank-1 mean is rank-1 exact.
                torch.testing.assert_close(ddp, exact, rtol=1e-5, atol=1e-6)
            else:
                assert (ddp - exact).abs().max() > 1e-3  # a full-rank mean is approximated


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("runtime-distributed")
    url = f"sqlite:///{tmp / 'slotsweep.db'}"
    upgrade_schema(url)
    yield url, tmp


@pytest.fixture(scope="module")
def reference(shared: tuple[str, Path]) -> tuple[TrialHandle, str]:
    """The uninterrupted two-rank run every other check compares against."""
    url, tmp = shared
    handle = create_trial(url, tmp, **COMMON)
    result = run_worker(handle)
    assert result.returncode == 0, result.stderr[-4000:]
    return handle, result.stdout + result.stderr


def test_metrics_are_averaged_across_ranks_and_land_in_the_database(
    reference: tuple[TrialHandle, str],
) -> None:
    handle, log = reference
    url, trial_id = handle.db_url, handle.spec.trial_id
    # Rank r reports r for every batch: the recorded value is the mean of both ranks.
    assert series(url, trial_id, "rank_value") == {step: 0.5 for step in range(1, 13)}
    with session_scope(url) as session:
        epochs = {
            m.step: m.epoch
            for m in session.scalars(select(Metric).where(Metric.trial_id == trial_id))
        }
    assert epochs[4] == 0.5 and epochs[12] == 1.5
    # Validation is sample-weighted over both shards (8 samples each, batches of 3, 3, 2).
    assert series(url, trial_id, "val_rank_value", MetricKind.VALIDATION) == {
        4: 0.5,
        8: 0.5,
        12: 0.5,
    }
    val_loss = series(url, trial_id, "val_loss", MetricKind.VALIDATION)
    row = trial_row(url, trial_id)
    assert row.total_batches == 12 and row.searcher_metric_value == val_loss[12]
    assert row.finished_at is not None and row.pruned_at is None
    study = optuna.load_study(study_name=handle.spec.study_name, storage=optuna_storage(url))
    frozen = next(
        t
        for t in study.trials
        if optuna_trial_id(url, handle.spec.study_name, t.number) == handle.spec.optuna_trial_id
    )
    assert frozen.intermediate_values == val_loss  # batches unit: steps 4, 8, 12
    assert frozen.state == optuna.trial.TrialState.RUNNING
    assert "[rank 0] slotsweep: trial" in log and "[rank 1] slotsweep: trial" in log


def test_timings_are_windowed_aggregates(reference: tuple[TrialHandle, str]) -> None:
    handle, _ = reference
    with session_scope(handle.db_url) as session:
        rows = list(session.scalars(select(Timing).where(Timing.trial_id == handle.spec.trial_id)))
    by_phase: dict[str, list[tuple[int, int, int]]] = {}
    for row in rows:
        by_phase.setdefault(row.name, []).append((row.start_step, row.end_step, row.count))
        assert 0 <= row.p50_s <= row.p95_s and row.mean_s * row.count == pytest.approx(row.total_s)
    for phase in (
        "dataloader_next",
        "to_device",
        "train_batch",
        "step_lr_schedulers",
        "reduce_metrics",
        "from_device",
    ):
        assert sorted(by_phase[phase]) == [(0, 4, 4), (4, 8, 4), (8, 12, 4)]


def test_checkpoints_are_recorded_and_collected(reference: tuple[TrialHandle, str]) -> None:
    handle, _ = reference
    rows = checkpoint_rows(handle.db_url, handle.spec.trial_id)
    assert [r.step for r in rows] == [4, 8, 12]
    with session_scope(handle.db_url) as session:
        key = session.get_one(Experiment, handle.spec.experiment_id).checkpoint_key
    val_loss = series(handle.db_url, handle.spec.trial_id, "val_loss", MetricKind.VALIDATION)
    best_step = min(val_loss, key=val_loss.__getitem__)
    for row in rows:
        assert row.metrics["val_loss"] == val_loss[row.step]
        assert row.epoch == row.step / 8
        expected = (
            CheckpointState.COMPLETED if row.step in (12, best_step) else CheckpointState.DELETED
        )
        assert row.state == expected
        assert Path(row.path).exists() == (expected == CheckpointState.COMPLETED)
        assert Path(row.path).parent == Path(handle.spec.checkpoint_storage.path) / (
            f"{handle.spec.experiment_id}-{key}"
        ) / str(handle.spec.trial_id)
    final = read_checkpoint(rows[-1].path)
    assert final["step"] == 12 and len(final["rng"]) == 2  # both ranks' RNG states
    assert not torch.equal(final["rng"][0]["torch"], final["rng"][1]["torch"])
    assert rows[-1].size_bytes == sum(p.stat().st_size for p in Path(rows[-1].path).iterdir())


def test_ranks_hold_identical_state_every_step(reference: tuple[TrialHandle, str]) -> None:
    handle, _ = reference
    assert digests(handle, 0, 0) == digests(handle, 1, 0)


def test_only_rank_0_imports_the_database_s_code(reference: tuple[TrialHandle, str]) -> None:
    handle, _ = reference
    scratch = Path(handle.spec.scratch_dir)
    rank1 = json.loads((scratch / "rank-1" / "modules.json").read_text())
    # Forked from the torchrun wrapper, which passed the fence for the node
    # (trials.node._fence) without importing it itself, rank 1 never touches the database;
    # only rank 0 records. (Plain torchrun's ranks check the fence themselves:
    # tests/trials/runtime/test_fencing.py.)
    assert rank1 == {"optuna": False, "sqlalchemy": False, "streamlit": False, "storage": False}
    rank0 = json.loads((scratch / "rank-0" / "modules.json").read_text())
    assert rank0["storage"] and rank0["sqlalchemy"] and not rank0["streamlit"]


def test_ranks_are_forked_from_the_wrapper_each_in_a_session_of_its_own(
    reference: tuple[TrialHandle, str],
) -> None:
    handle, _ = reference
    scratch = Path(handle.spec.scratch_dir)
    ranks = [json.loads((scratch / f"rank-{r}" / "process.json").read_text()) for r in (0, 1)]
    # Both children of one process, the wrapper's torchrun: forked, so still running its
    # program (torch imported once, by the agent), not a Python of their own.
    assert ranks[0]["parent"] == ranks[1]["parent"]
    assert all(rank["program"][1:3] == ["-m", "trials.node.torchrun"] for rank in ranks), ranks
    # As torchrun starts a program: a session of its own (stopping the agent's process
    # group does not reach it), one thread each when a node runs two ranks
    # (OMP_NUM_THREADS, which torchrun sets after the agent imported torch), and the
    # environment the agent alone needed taken back.
    assert all(rank["session_leader"] for rank in ranks), ranks
    assert all(rank["threads"] == 1 for rank in ranks), ranks
    assert all(rank["nvml_check"] is None for rank in ranks), ranks


def test_sigkilled_rank_then_restore_continues_the_same_trajectory(
    shared: tuple[str, Path], reference: tuple[TrialHandle, str]
) -> None:
    url, tmp = shared
    ref, _ = reference
    crashed = create_trial(
        url, tmp, hparams={"global_batch_size": 8, "crash_at_step": 6}, **COMMON
    )
    result = run_worker(crashed)
    assert result.returncode != 0
    log = result.stdout + result.stderr
    # Written just before the SIGKILL, by Python and at the file-descriptor level.
    assert "[rank 1] python line before SIGKILL at step 6" in log
    assert "[rank 1] fd-level line before SIGKILL" in log
    row = trial_row(url, crashed.spec.trial_id)
    assert row.finished_at is None and row.pruned_at is None
    latest = [
        c
        for c in checkpoint_rows(url, crashed.spec.trial_id)
        if c.state == CheckpointState.COMPLETED
    ][-1]
    assert latest.step == 4

    # The driver's restart: the next attempt, from the latest checkpoint.
    restarted = crashed.with_changes(attempt=1, restore_checkpoint_path=latest.path)
    result = run_worker(restarted)
    assert result.returncode == 0, result.stderr[-4000:]

    # After the restore both ranks hold the reference's parameters and optimizer state
    # of step 4, and from there the same trajectory follows.
    resumed = [digests(crashed, rank, 1) for rank in (0, 1)]
    assert min(resumed[0]) == 4
    assert resumed[0] == resumed[1]
    assert resumed[0][4] == digests(ref, 0, 0)[4]
    assert series(url, crashed.spec.trial_id, "loss") == series(url, ref.spec.trial_id, "loss")
    assert series(url, crashed.spec.trial_id, "val_loss", MetricKind.VALIDATION) == series(
        url, ref.spec.trial_id, "val_loss", MetricKind.VALIDATION
    )
    row = trial_row(url, crashed.spec.trial_id)
    assert row.finished_at is not None and row.total_batches == 12


def test_pruned_trial_stops_every_rank_cleanly(shared: tuple[str, Path]) -> None:
    url, tmp = shared
    handle = create_trial(
        url,
        tmp,
        study_name="pruned",
        # Any positive loss is above the threshold: pruned at the first validation.
        pruner={"name": "ThresholdPruner", "kwargs": {"upper": 0.0}},
        optimizations={"average_training_metrics": False},
        **COMMON,
    )
    result = run_worker(handle)
    assert result.returncode == 0, result.stderr[-4000:]
    log = result.stdout + result.stderr
    assert (
        "[rank 0] slotsweep: trial" in log
        and "[rank 1] slotsweep: trial" in log
        and "pruned" in log
    )
    row = trial_row(url, handle.spec.trial_id)
    assert row.pruned_at is not None and row.finished_at is None and row.total_batches == 4
    assert checkpoint_rows(url, handle.spec.trial_id) == []  # no checkpoint for a pruned trial
    # average_training_metrics: false records rank 0's own values.
    assert series(url, handle.spec.trial_id, "rank_value") == {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}
    study = optuna.load_study(study_name="pruned", storage=optuna_storage(url))
    frozen = next(
        t
        for t in study.trials
        if optuna_trial_id(url, "pruned", t.number) == handle.spec.optuna_trial_id
    )
    assert list(frozen.intermediate_values) == [4]


def test_optimizations_and_core_api_against_reference_computations(
    shared: tuple[str, Path],
) -> None:
    url, tmp = shared
    linear = {"linear": True, "momentum": 0.0, "lr": 0.1}
    aggregated = create_trial(
        url,
        tmp,
        study_name="checks",
        hparams={"global_batch_size": 8, **linear},
        max_length={"batches": 4},
        optimizations={"aggregation_frequency": 4},
    )
    big = create_trial(
        url,
        tmp,
        study_name="checks",
        hparams={"global_batch_size": 32, **linear},
        max_length={"batches": 1},
    )
    core = create_trial(url, tmp, study_name="checks", entrypoint="runtime_trials:core_main")
    out = tmp / "checks"
    out.mkdir()
    result = run_torchrun(
        [str(FIXTURES / "dist_checks.py")],
        env={
            "DIST_CHECKS_OUT": str(out),
            "DIST_CHECKS_SPECS": json.dumps([str(h.spec_path) for h in (aggregated, big, core)]),
        },
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((out / "outcomes-rank1.json").read_text()) == ["finished"] * 3

    hooks = json.loads((out / "hooks-rank0.json").read_text())
    assert hooks["backend"] == "gloo"
    assert_compression_hooks(hooks, bf16_hook="_bf16_compress_hook_gloo")

    # aggregation_frequency 4 over 2 ranks (DDP no_sync) == one step on the 4x batch.
    weights = []
    for handle in (aggregated, big):
        (row,) = checkpoint_rows(url, handle.spec.trial_id)
        weights.append(read_checkpoint(row.path)["models"][0]["weight"])
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-6, atol=1e-7)

    # Core API: rank r reports r + step; the recorded value is the mean over ranks.
    assert series(url, core.spec.trial_id, "loss") == {1: 1.5, 2: 2.5, 3: 3.5}
    assert series(url, core.spec.trial_id, "val_loss", MetricKind.VALIDATION) == {3: 10.5}
    (ckpt,) = checkpoint_rows(url, core.spec.trial_id)
    assert read_checkpoint(ckpt.path)["user_state"]["weight"].tolist() == [3.0, 3.0, 3.0]
    row = trial_row(url, core.spec.trial_id)
    assert row.finished_at is not None and row.searcher_metric_value == 10.5
    for rank in (0, 1):
        seen = json.loads((Path(core.spec.scratch_dir) / f"rank-{rank}" / "core.json").read_text())
        assert seen["rank"] == rank


@pytest.mark.gpu(devices=2)
def test_gradient_compression_hooks_on_nccl(db_url: str, tmp_path: Path) -> None:
    """The hook checks above on two GPUs over NCCL (where bf16 takes torch's own
    ``bf16_compress_hook``), then a real trial per compression in the same group: each
    finishes, its losses are finite, and both ranks hold identical weights every step
    although their data differ."""
    handles = {
        compression: create_trial(
            db_url,
            tmp_path,
            study_name="nccl",
            hparams={"global_batch_size": 8, "noise_rank_data": True},
            optimizations={"gradient_compression": compression},
            **COMMON,
        )
        for compression in ("fp16", "bf16", "powersgd")
    }
    out = tmp_path / "checks"
    out.mkdir()
    result = run_torchrun(
        [str(FIXTURES / "dist_checks.py")],
        env={
            "DIST_CHECKS_OUT": str(out),
            "DIST_CHECKS_DEVICE": "cuda",
            "DIST_CHECKS_SPECS": json.dumps([str(h.spec_path) for h in handles.values()]),
        },
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert json.loads((out / f"outcomes-rank{rank}.json").read_text()) == ["finished"] * 3
        report = json.loads((out / f"hooks-rank{rank}.json").read_text())
        assert (report["backend"], report["device"]) == ("nccl", f"cuda:{rank}")
    assert_compression_hooks(
        json.loads((out / "hooks-rank0.json").read_text()), bf16_hook="bf16_compress_hook"
    )
    for compression, handle in handles.items():
        trial_id = handle.spec.trial_id
        assert trial_row(db_url, trial_id).finished_at is not None, compression
        losses = series(db_url, trial_id, "loss")
        assert sorted(losses) == list(range(1, 13)), (compression, losses)
        assert all(v is not None and math.isfinite(v) for v in losses.values()), losses
        assert digests(handle, 0, 0) == digests(handle, 1, 0), compression
