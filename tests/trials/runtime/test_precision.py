from __future__ import annotations

import pytest
import torch

from trials.runtime._precision import plan_mixed_precision, resolve_mixed_precision


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
