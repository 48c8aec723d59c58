"""The managed loop's overhead benchmark: where it runs, and a real run on CUDA."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtime_overhead import resolve_device

from tests.conftest import REPO_ROOT, cli_environment

RATIO_LINE = re.compile(r"managed_steps_s=(\S+) raw_steps_s=(\S+) ratio=(\S+)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_is_refused_in_one_line_without_a_gpu() -> None:
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(SystemExit) as exited:
        resolve_device("cuda")
    assert exited.value.code == "runtime_overhead: --device cuda, but torch sees no CUDA device"


@pytest.mark.gpu
@pytest.mark.slow
def test_a_short_run_on_cuda_prints_its_ratio(tmp_path: Path) -> None:
    env = cli_environment()
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "runtime_overhead.py"),
            "--device",
            "cuda",
            "--steps",
            "40",
            "--warmup",
            "10",
            "--repeats",
            "2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    lines = result.stdout.strip().splitlines()
    assert any(line.startswith("device=cuda:0 ranks=1 ") for line in lines), lines
    found = RATIO_LINE.fullmatch(lines[-1])
    assert found, lines[-1]
    managed, raw, ratio = (float(value) for value in found.groups())
    assert all(math.isfinite(v) and v > 0 for v in (managed, raw, ratio)), lines[-1]
    assert ratio == pytest.approx(managed / raw, rel=1e-2)
