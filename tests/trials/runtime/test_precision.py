from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from storage import Metric, MetricKind, Trial, session_scope
from trials.runtime._precision import plan_mixed_precision, resolve_mixed_precision

from .conftest import TrialHandle, run_worker


@pytest.mark.parametrize(
    ("mode", "bf16", "fp16", "dtype", "scaler"),
    [
        ("none", True, True, None, False),
        ("bf16", True, False, torch.bfloat16, False),
        ("fp16", True, True, torch.float16, True),
        ("bf16", False, True, None, False),
        ("fp16", True, False, None, False),
    ],
)
def test_plan(mode: str, bf16: bool, fp16: bool, dtype: torch.dtype | None, scaler: bool) -> None:
    plan = plan_mixed_precision(mode, "cuda", bf16_supported=bf16, fp16_supported=fp16)  # type: ignore[arg-type]
    assert plan.dtype == dtype
    assert plan.use_grad_scaler == scaler
    unsupported = mode != "none" and dtype is None
    assert (plan.warning is not None) == unsupported
    if unsupported:
        assert plan.warning == (
            f"optimizations.mixed_precision: {mode} is not supported natively on this cuda "
            "device; training runs in full precision (float32) instead"
        )


def test_this_cpu_autocasts_exactly_what_it_supports() -> None:
    """On the CPU, bf16 autocast changes a matmul's dtype when oneDNN supports it; fp16
    without native support is a no-op with the warning (the forward stays float32)."""
    x, w = torch.randn(4, 8), torch.randn(8, 2)
    for mode, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        plan = resolve_mixed_precision(mode, torch.device("cpu"))  # type: ignore[arg-type]
        with plan.autocast():
            out = x @ w
        if plan.enabled:
            assert out.dtype == dtype and plan.warning is None
            # Against the float32 reference: equal within the dtype's precision.
            torch.testing.assert_close(out.float(), x @ w, rtol=2e-2, atol=5e-2)
        else:
            assert out.dtype == torch.float32 and "this CPU" in (plan.warning or "")
            assert torch.equal(out, x @ w)
        assert (plan.grad_scaler() is not None) == (plan.enabled and mode == "fp16")


@pytest.mark.parametrize("native", [True, False])
def test_cuda_bf16_counts_only_native_support(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """A pre-Ampere GPU can store bfloat16 (torch's default check counts that emulation)
    but not compute in it: there bf16 is the warned no-op, not a slow emulated run."""
    asked: list[bool] = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return native or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    plan = resolve_mixed_precision("bf16", torch.device("cuda", 0))
    assert asked == [False]
    assert plan.enabled == native
    assert (plan.warning is None) == native


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_mixed_precision_trains_on_cuda(mode: str, make_trial: Callable[..., TrialHandle]) -> None:
    """A real run (``torchrun -m trials.node.worker``, one rank on cuda:0): the forward runs
    under autocast in the mode's dtype while the weights stay float32, fp16 scales the
    loss with a GradScaler that the loop steps and updates (bf16 has none), and every
    recorded metric is finite."""
    if mode == "bf16":
        major, minor = torch.cuda.get_device_capability(0)
        if major < 8:
            pytest.skip(f"bf16 needs compute capability 8.0 natively (found {major}.{minor})")
    handle = make_trial(
        entrypoint="gpu_trials:PrecisionTrial",
        slots_per_trial=1,
        max_length={"batches": 16},
        min_validation_period={"batches": 8},
        optimizations={"mixed_precision": mode},
        profiling={"enabled": False},
    )
    result = run_worker(handle, nproc=1)
    assert result.returncode == 0, result.stderr[-4000:]

    dtype = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}[mode]
    report = json.loads((Path(handle.spec.scratch_dir) / "rank-0" / "precision.json").read_text())
    assert report["device"] == "cuda:0"
    assert report["autocast_dtype"] == dtype
    assert report["output_dtypes"] == [dtype]
    assert report["parameter_dtypes"] == ["torch.float32"]
    if mode == "fp16":
        scaler = report["scaler"]
        assert scaler is not None
        # Each update() after a step either counts a good step (growth tracker) or, after
        # an overflow, backs the scale off: 16 updates cannot leave both where they began.
        assert (scaler["scale"], scaler["growth_tracker"]) != (scaler["initial_scale"], 0)
        assert math.isfinite(scaler["scale"]) and scaler["scale"] > 0
    else:
        assert report["scaler"] is None

    with session_scope(handle.db_url) as session:
        trial = session.get(Trial, handle.spec.trial_id)
        assert trial is not None
        assert trial.finished_at is not None, trial.error
        rows = session.execute(
            select(Metric.kind, Metric.step, Metric.name, Metric.value).where(
                Metric.trial_id == handle.spec.trial_id, Metric.name.in_(["loss", "val_loss"])
            )
        ).all()
    steps = {(kind, name): set() for kind, _, name, _ in rows}
    for kind, step, name, value in rows:
        steps[(kind, name)].add(step)
        assert value is not None and math.isfinite(value), (kind, step, name, value)
    assert steps[(MetricKind.VALIDATION, "val_loss")] == {8, 16}
    assert 16 in steps[(MetricKind.TRAINING, "loss")]
