"""Mixed precision: which autocast dtype and whether a GradScaler, for this device.

fp16 needs loss scaling (its exponent range underflows small gradients), bf16 does
not. Where the hardware cannot run the requested dtype natively (fp16 on most CPUs,
bf16 on pre-Ampere GPUs) the setting becomes a no-op with one clear warning rather
than a slow emulation or an error: the same experiment config runs everywhere.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch

MixedPrecision = Literal["none", "fp16", "bf16"]


@dataclass(frozen=True)
class PrecisionPlan:
    """What the loop does for ``mixed_precision``: autocast dtype (or none) and scaler."""

    device_type: str
    dtype: torch.dtype | None
    use_grad_scaler: bool
    warning: str | None = None

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The autocast context for forward passes (a null context when disabled)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type) if self.use_grad_scaler else None


def plan_mixed_precision(
    mode: MixedPrecision, device_type: str, *, bf16_supported: bool, fp16_supported: bool
) -> PrecisionPlan:
    """Decide autocast and loss scaling; pure, so every branch is testable anywhere.

    Example:
        >>> plan = plan_mixed_precision("fp16", "cpu", bf16_supported=True, fp16_supported=False)
        >>> plan.enabled, plan.warning is not None
        (False, True)
    """
    if mode == "none":
        return PrecisionPlan(device_type, None, False)
    supported = bf16_supported if mode == "bf16" else fp16_supported
    if not supported:
        where = "this CPU" if device_type == "cpu" else f"this {device_type} device"
        return PrecisionPlan(
            device_type,
            None,
            False,
            warning=(
                f"optimizations.mixed_precision: {mode} is not supported natively on {where}; "
                "training runs in full precision (float32) instead"
            ),
        )
    if mode == "bf16":
        return PrecisionPlan(device_type, torch.bfloat16, False)
    return PrecisionPlan(device_type, torch.float16, True)


def device_support(device: torch.device) -> tuple[bool, bool]:
    """``(bf16_supported, fp16_supported)`` natively on ``device`` (for CUDA: the current
    device, which :func:`~trials.runtime._distributed.select_device` set to this rank's)."""
    if device.type == "cuda":
        # Natively: Ampere or newer. torch's default also counts emulation (pre-Ampere
        # GPUs that merely store bfloat16), which would train slowly instead of warning.
        return torch.cuda.is_bf16_supported(including_emulation=False), True
    if device.type == "cpu":
        # oneDNN reports whether the CPU has the instructions (AVX512-BF16, AMX, AVX512-FP16).
        mkldnn = torch.ops.mkldnn
        return bool(mkldnn._is_mkldnn_bf16_supported()), bool(mkldnn._is_mkldnn_fp16_supported())
    return False, False


def resolve_mixed_precision(mode: MixedPrecision, device: torch.device) -> PrecisionPlan:
    """The plan for ``mode`` on this rank's ``device``."""
    if mode == "none":
        return PrecisionPlan(device.type, None, False)
    bf16, fp16 = device_support(device)
    return plan_mixed_precision(mode, device.type, bf16_supported=bf16, fp16_supported=fp16)
