"""A real search on GPUs: the driver's placement is where the ranks run.

One search (``slotsweep run`` with a cluster file whose agent holds the machine's last
GPUs, so that on a machine with more than two the slots are not simply 0 and 1) runs
two trials one after the other on one warm job of two slots (one slot on a machine
with a single GPU). Its trial (``_gpu_model.py``) writes down per rank where it runs;
the tests read that and the database:

- each rank sees exactly the allocated slots as ``CUDA_VISIBLE_DEVICES``, runs on its
  own device among them (the same physical GPU, by UUID, as the slot's NVML index),
  holds its weights there and joins an NCCL group (two GPUs);
- the sampler recorded NVML metrics for the allocated GPUs, and saw the trial's memory;
- the warm job's second trial started with the first trial's cached CUDA memory handed
  back and the peak statistics reset.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from storage import (
    ProcessRole,
    SystemMetric,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    WarmJob,
    session_scope,
)
from tests.conftest import cli_environment
from tests.gpu import cuda_device_count, normalise_uuid, nvml_uuids
from tests.searcher._gpu_model import BLOCK_BYTES
from tests.searcher.conftest import run_to_end

pytestmark = pytest.mark.slow

MODEL = Path(__file__).parent / "_gpu_model.py"
AGENT = "gpu-agent"
TRIALS = (0, 1)
GPU_MEMORY_METRICS = {"gpu_memory_used_gb", "gpu_memory_free_gb", "gpu_memory_util_percent"}


@dataclass(frozen=True)
class GpuSearch:
    db: str
    probe_dir: Path
    slots: tuple[int, ...]  # the cluster file's agent: the slots every trial gets

    def probe(self, trial: int, rank: int) -> dict[str, Any]:
        return dict(json.loads((self.probe_dir / f"trial-{trial}-rank-{rank}.json").read_text()))

    def runs(self) -> list[TrialRun]:
        with session_scope(self.db) as session:
            return list(session.scalars(select(TrialRun).order_by(TrialRun.id)))

    def trial_ids(self) -> dict[int, int]:
        """Trial row id by Optuna trial number."""
        with session_scope(self.db) as session:
            return {t.optuna_trial_number: t.id for t in session.scalars(select(Trial))}


@pytest.fixture(scope="module")
def gpu_search(tmp_path_factory: pytest.TempPathFactory) -> GpuSearch:
    tmp = tmp_path_factory.mktemp("gpu-search")
    gpus = len(nvml_uuids())
    slots = tuple(range(gpus))[-min(2, cuda_device_count()) :]
    folder, probe_dir = tmp / "exp", tmp / "probes"
    folder.mkdir()
    probe_dir.mkdir()
    shutil.copy(MODEL, folder / "gpu_model.py")
    config = {
        "name": "gpu-probe",
        "entrypoint": "gpu_model:GpuProbeTrial",
        "hyperparameters": {"global_batch_size": 16},
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_trials": len(TRIALS),
            "max_length": {"batches": 16},
            "max_concurrent_trials": 1,
            "seed": 0,
            "pruner": {"name": "none"},
        },
        "resources": {"slots_per_trial": len(slots), "reuse_workers": True},
        "min_validation_period": {"batches": 8},
        "min_checkpoint_period": {"batches": 16},
        "profiling": {"system_metrics_interval_s": 0.2},
        "max_restarts": 0,
        # 16 batches of 50 ms: several samples of the sampler while the trial trains.
        "data": {"probe_dir": str(probe_dir), "batch_sleep_s": 0.05},
    }
    experiment = folder / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster = tmp / "cluster.yaml"
    agent = {"name": AGENT, "host": "127.0.0.1", "slots": list(slots)}
    cluster.write_text(
        yaml.safe_dump({"resource_pools": [{"name": "default", "agents": [agent]}]})
    )
    db = f"sqlite:///{tmp / 'sweep.db'}"
    run_to_end(
        ["run", str(experiment), "--db", db, "--cluster", str(cluster)], cli_environment(), tmp
    )
    search = GpuSearch(db=db, probe_dir=probe_dir, slots=slots)
    with session_scope(db) as session:
        ended = [(t.state, t.error) for t in session.scalars(select(Trial))]
    assert [state for state, _ in ended] == [TrialState.COMPLETED] * len(TRIALS), ended
    return search


@pytest.mark.gpu(devices=2)
def test_each_rank_runs_on_its_own_allocated_gpu_over_nccl(gpu_search: GpuSearch) -> None:
    slots = gpu_search.slots
    visible = ",".join(str(slot) for slot in slots)
    uuids = nvml_uuids()
    runs = gpu_search.runs()
    assert len(runs) == len(TRIALS)
    for run in runs:
        assert [(a["agent"], a["slots"]) for a in run.agents] == [(AGENT, list(slots))]
    for trial in TRIALS:
        seen = []
        for rank in range(len(slots)):
            probe = gpu_search.probe(trial, rank)
            local = probe["local_rank"]
            assert probe["world_size"] == len(slots) == 2
            assert probe["cuda_visible_devices"] == visible == probe["slotsweep_slots"]
            assert probe["device_count"] == len(slots)
            assert probe["device"] == f"cuda:{local}"
            assert probe["current_device"] == local
            assert probe["parameter_devices"] == [f"cuda:{local}"]
            assert probe["ddp_device_ids"] == [local]
            assert probe["backend"] == "nccl"
            # The physical GPU is the slot's, as NVML (and so the scheduler) numbers it.
            assert normalise_uuid(probe["device_uuid"]) == uuids[slots[local]], probe
            seen.append(probe["device_uuid"])
        assert len(set(seen)) == len(slots), seen  # one device per rank
    with session_scope(gpu_search.db) as session:
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
    assert len(ranks) == len(TRIALS) * len(slots)
    for row in ranks:
        assert row.local_rank is not None
        assert row.slots == [slots[row.local_rank]]


@pytest.mark.gpu
def test_nvml_metrics_are_recorded_for_the_allocated_gpus(gpu_search: GpuSearch) -> None:
    for trial_id in gpu_search.trial_ids().values():
        with session_scope(gpu_search.db) as session:
            rows = list(
                session.scalars(
                    select(SystemMetric).where(
                        SystemMetric.trial_id == trial_id, SystemMetric.gpu_index.is_not(None)
                    )
                )
            )
        assert {row.agent for row in rows} == {AGENT}
        values: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            assert row.gpu_index is not None and math.isfinite(row.value), row.name
            values[row.gpu_index][row.name].append(row.value)
        # The sampler records every GPU of the agent's host; the allocated ones among them.
        assert set(gpu_search.slots) <= set(values), sorted(values)
        for slot in gpu_search.slots:
            metrics = values[slot]
            assert set(metrics) >= GPU_MEMORY_METRICS, (slot, sorted(metrics))
            assert all(0.0 <= v <= 100.0 for v in metrics["gpu_memory_util_percent"])
            assert all(0.0 <= v <= 100.0 for v in metrics.get("gpu_util_percent", []))
            assert min(metrics["gpu_memory_free_gb"]) >= 0.0
            # Each rank's context and the block it keeps cached while it trains.
            assert max(metrics["gpu_memory_used_gb"]) >= BLOCK_BYTES / 1e9, (slot, metrics)


@pytest.mark.gpu
def test_a_warm_trial_starts_with_the_cuda_cache_emptied(gpu_search: GpuSearch) -> None:
    runs = gpu_search.runs()
    # Both trials on one job (one launch token): the second started warm.
    assert len({run.launch_token for run in runs}) == 1, [r.launch_token for r in runs]
    with session_scope(gpu_search.db) as session:
        (job,) = session.scalars(select(WarmJob)).all()
        assert job.trials_run == len(TRIALS)
    for rank in range(len(gpu_search.slots)):
        first, second = gpu_search.probe(0, rank), gpu_search.probe(1, rank)
        # The first trial ended with a block in the allocator's cache and in its peak...
        assert first["reserved_after_block"] >= BLOCK_BYTES
        # ...which the reset between trials handed back and cleared before the second.
        assert second["reserved_at_start"] < BLOCK_BYTES, second
        assert second["peak_at_start"] < BLOCK_BYTES, second
