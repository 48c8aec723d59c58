"""The managed loop's overhead benchmark: its shapes, a short real run on the CPU (every
CI run), and one on CUDA."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtime_overhead import MODELS, resnet18, resolve_device, shape, time_parts

from tests.conftest import REPO_ROOT, cli_environment

RATIO_LINE = re.compile(
    r"model=(\S+) managed_steps_s=(\S+) raw_steps_s=(\S+) ratio=(\S+) median_paired=(\S+) "
    r"cpu_ms_raw=(\S+) cpu_ms_managed=(\S+)"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_is_refused_in_one_line_without_a_gpu() -> None:
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(SystemExit) as exited:
        resolve_device("cuda")
    assert exited.value.code == "runtime_overhead: --device cuda, but torch sees no CUDA device"


def test_the_resnet_written_here_is_torchvisions_resnet18() -> None:
    # torchvision's resnet18(num_classes=10): 11,689,512 parameters less the 1000-class head
    # (512 x 1000 + 1000), plus a 10-class one (512 x 10 + 10).
    model = resnet18(10)
    assert sum(p.numel() for p in model.parameters()) == 11_181_642
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("model", MODELS)
def test_each_shape_trains_a_step_on_the_cpu(model: str) -> None:
    one = shape(model, "cpu")
    network = one.build()
    x = torch.randn(2, *one.sample)
    loss = torch.nn.functional.cross_entropy(network(x), torch.tensor([0, 1]))
    loss.backward()
    assert math.isfinite(loss.item())
    assert one.batch <= 128  # the CPU's sizes; the GPU's wide MLP is 1.8 TFLOP a step
    assert shape("wide-mlp", "cuda").describe == "MLP 1024-8192-8192-8192-10"


def test_the_per_batch_parts_are_timed_on_the_cpu() -> None:
    parts = {name: (us, per_batch) for name, us, per_batch in time_parts("cpu")}
    assert set(parts) == {
        "metric accumulation (one metric)",
        "phase timings (4 laps)",
        "to_device of (64x256, 64)",
        "preemption check",
        "prune gate",
    }
    assert all(us > 0 and math.isfinite(us) for us, _ in parts.values())
    assert parts["preemption check"][1] == pytest.approx(0.01)  # one report per 100 batches


def run_bench(tmp_path: Path, *args: str) -> list[str]:
    env = cli_environment()
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "runtime_overhead.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    return result.stdout.strip().splitlines()


def check_figures(line: str, model: str) -> None:
    found = RATIO_LINE.fullmatch(line)
    assert found, line
    assert found.group(1) == model
    managed, raw, ratio, median, cpu_raw, cpu_managed = (float(v) for v in found.groups()[1:])
    assert all(
        math.isfinite(v) and v > 0 for v in (managed, raw, ratio, median, cpu_raw, cpu_managed)
    ), line
    assert ratio == pytest.approx(managed / raw, rel=1e-2)


@pytest.mark.slow
def test_a_short_run_on_the_cpu_prints_both_ratios_and_the_cpu_time(tmp_path: Path) -> None:
    lines = run_bench(
        tmp_path, "--device", "cpu", "--steps", "6", "--warmup", "2", "--repeats", "1"
    )
    assert lines[0].startswith("managed loop's per-batch parts on cpu")
    assert any(
        line.startswith("model=mlp (MLP 256-512-512-10, 64 per rank) device=cpu ranks=2 ")
        for line in lines
    ), lines
    assert any("best-of ratio=" in line and "median of paired ratios=" in line for line in lines)
    check_figures(lines[-1], "mlp")


@pytest.mark.gpu
@pytest.mark.slow
def test_a_short_run_on_cuda_prints_its_ratio(tmp_path: Path) -> None:
    lines = run_bench(
        tmp_path, "--device", "cuda", "--steps", "40", "--warmup", "10", "--repeats", "2"
    )
    assert any(
        line.startswith("model=mlp (") and " device=cuda:0 ranks=1 " in line for line in lines
    )
    check_figures(lines[-1], "mlp")
