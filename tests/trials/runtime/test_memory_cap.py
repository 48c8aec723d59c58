"""A share trial's memory cap on CPU: the line a simulated out-of-memory error becomes.

The cap itself (``torch.cuda.set_per_process_memory_fraction``) and a real OOM over it
are checked on a GPU: tests/searcher/test_gpu_search.py (``-m gpu``).
"""

from __future__ import annotations

import pytest
import torch

from trials.launch.shares import SHARE_ENV_VAR
from trials.runtime._memory_cap import (
    NO_MEMORY_CAP,
    MemoryCap,
    ShareMemoryExceeded,
    apply_memory_cap,
    explain_memory_error,
    is_out_of_memory,
)

# torch's own message for an allocation past a per-process fraction (torch 2.x).
TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
    "139.81 GiB of which 118.52 GiB is free. Including non-PyTorch memory, this process "
    "has 21.28 GiB memory in use. Of the allocated memory 20.00 GiB is allocated by "
    "PyTorch, with 34.95 GiB allowed; and 0 bytes is reserved by PyTorch but unallocated."
)


def test_an_out_of_memory_error_over_the_cap_names_the_cap_and_the_share() -> None:
    cap = MemoryCap(share=0.25, gpu="1", total_bytes=int(139.81 * 2**30))
    explained = cap.explain(torch.OutOfMemoryError(TORCH_OOM))
    assert isinstance(explained, ShareMemoryExceeded)
    line = str(explained)
    assert "\n" not in line
    assert line == (
        "CUDA out of memory above this trial's memory cap of 35 GiB: its share 1/4 of GPU 1 "
        "(140 GiB), resources.slots_per_trial 0.25 (it tried to allocate 20.00 GiB more); "
        "give the trial a larger share or make it use less memory"
    )


def test_other_errors_pass_unchanged() -> None:
    cap = MemoryCap(share=0.5, gpu="0", total_bytes=2**34)
    error = ValueError("bad shape")
    assert cap.explain(error) is error
    assert NO_MEMORY_CAP.explain(torch.OutOfMemoryError(TORCH_OOM)).__class__ is (
        torch.OutOfMemoryError
    )
    assert is_out_of_memory(RuntimeError(TORCH_OOM)) and not is_out_of_memory(error)


def test_on_the_cpu_a_share_caps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARE_ENV_VAR, "0.25")
    assert apply_memory_cap(torch.device("cpu")) is NO_MEMORY_CAP
    oom = torch.OutOfMemoryError(TORCH_OOM)
    assert explain_memory_error(oom) is oom
