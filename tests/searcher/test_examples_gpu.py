"""The charlm example at its default size on one GPU: how busy the search's own NVML
samples say the GPU was while the trial trained, and the trial's tokens per second.

The default size is the model's defaults (``examples/charlm/model.py``: 6 layers 384
wide, 6 heads, windows of 256 characters; nanoGPT's Shakespeare model) at a global
batch of 64 windows, under the example's bf16 autocast. The issue's target: the GPU at
least 50% busy. Both figures are printed for the README.
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from storage import (
    Metric,
    MetricKind,
    SystemMetric,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.conftest import EXAMPLES_DIR, cli_environment
from tests.searcher.conftest import run_to_end

pytestmark = pytest.mark.slow

BATCH = 64
BLOCK = 256
# About 4.5 epochs of the training text: long enough for many NVML samples at any speed
# a GPU of this decade trains this model at.
BATCHES = 1200
TARGET_BUSY_PERCENT = 50.0


def _default_size_search(folder: Path) -> Path:
    """experiment.yaml with one trial of the default size and a sensible recipe."""
    shutil.copytree(EXAMPLES_DIR / "charlm", folder, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load((folder / "experiment.yaml").read_text())
    config["hyperparameters"] = {
        **{k: v for k, v in config["hyperparameters"].items() if not isinstance(v, dict)},
        "global_batch_size": BATCH,
        "block_size": BLOCK,
        "n_layer": 6,
        "n_embd": 384,
        "lr": 1.0e-3,
        "warmup_steps": 100,
        "lr_decay": "cosine",
        "optimizer": "adamw",
        "weight_decay": 0.1,
    }
    config["searcher"].update(
        name="random", max_trials=1, max_length={"batches": BATCHES}, pruner={"name": "none"}
    )
    config["resources"] = {"slots_per_trial": 1}
    config["profiling"] = {"system_metrics_interval_s": 0.5}
    config["min_checkpoint_period"] = {"batches": BATCHES}
    path = folder / "gpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.gpu
def test_charlm_at_its_default_size_keeps_one_gpu_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _default_size_search(tmp_path / "charlm")
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    run_to_end(["run", str(path), "--db", db, "--slots", "1"], cli_environment(), tmp_path)

    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.COMPLETED, trial.error
        (run,) = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial.id)).all()
        (gpu,) = [slot for agent in run.agents for slot in agent["slots"]]
        reports: list[tuple[int, dt.datetime]] = [
            (m.step, m.recorded_at)
            for m in session.scalars(
                select(Metric)
                .where(
                    Metric.trial_id == trial.id,
                    Metric.kind == MetricKind.TRAINING,
                    Metric.name == "loss",
                )
                .order_by(Metric.step)
            )
        ]
        # From the first training record to the last: training, with its validations.
        first, last = reports[0], reports[-1]
        busy = [
            s.value
            for s in session.scalars(
                select(SystemMetric).where(
                    SystemMetric.trial_id == trial.id,
                    SystemMetric.gpu_index == gpu,
                    SystemMetric.name == "gpu_util_percent",
                    SystemMetric.recorded_at >= first[1],
                    SystemMetric.recorded_at <= last[1],
                )
            )
        ]
    seconds = (last[1] - first[1]).total_seconds()
    tokens_per_s = (last[0] - first[0]) * BATCH * BLOCK / seconds
    assert len(busy) >= 3, (busy, seconds)
    mean_busy = statistics.fmean(busy)
    with capsys.disabled():
        print(
            f"\ncharlm at its default size (6 x 384, batch {BATCH} x {BLOCK}, bf16) on GPU "
            f"{gpu}: {mean_busy:.0f}% busy (NVML, mean of {len(busy)} samples over "
            f"{seconds:.1f} s of training), {tokens_per_s:,.0f} tokens/s"
        )
    assert mean_busy >= TARGET_BUSY_PERCENT, (mean_busy, busy)
