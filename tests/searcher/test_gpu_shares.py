"""Shares of one GPU in real searches (issue 52 items 4 and 6): ``-m gpu`` only.

- Four trials on a quarter of one GPU each run on it at once: each sees only that GPU
  (``CUDA_VISIBLE_DEVICES``), its memory is capped at its quarter (an allocation a
  little past it fails, one a little short of it succeeds), and all four complete.
  Where the CUDA MPS control daemon runs, each got 25% of the GPU's threads.
- A trial that needs more than its share fails with one line naming the cap and the
  share, and its neighbour on the same GPU completes.

The CPU side (the environment each rank gets, the line from a simulated out-of-memory
error, MPS detection) is tested without a GPU: tests/trials/test_launcher_env.py and
tests/trials/runtime/test_memory_cap.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from storage import Trial, TrialFailure, TrialState, session_scope
from tests.conftest import cli_environment
from tests.gpu import normalise_uuid, nvml_uuids
from tests.searcher.conftest import run_to_end
from trials.launch.shares import mps_running

pytestmark = pytest.mark.slow

MODEL = Path(__file__).parent / "_gpu_share_model.py"
QUARTERS = 4


@dataclass(frozen=True)
class ShareSearch:
    db: str
    probes: dict[int, dict[str, Any]]
    slot: int


def _share_search(
    tmp: Path, *, trials: int, data: dict[str, Any], max_restarts: int = 0
) -> ShareSearch:
    """A search of ``trials`` quarter-GPU trials, all at once, on the machine's last GPU."""
    slot = len(nvml_uuids()) - 1
    folder, probe_dir = tmp / "exp", tmp / "probes"
    folder.mkdir()
    probe_dir.mkdir()
    shutil.copy(MODEL, folder / "gpu_share_model.py")
    config = {
        "name": "gpu-shares",
        "entrypoint": "gpu_share_model:GpuShareTrial",
        "hyperparameters": {"global_batch_size": 16},
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_trials": trials,
            "max_length": {"batches": 16},
            "max_concurrent_trials": trials,
            "seed": 0,
            "pruner": {"name": "none"},
        },
        "resources": {"slots_per_trial": 0.25},
        "min_validation_period": {"batches": 8},
        "max_restarts": max_restarts,
        "fail_fast_trials": 0,
        "data": {"probe_dir": str(probe_dir), **data},
    }
    experiment = folder / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster = tmp / "cluster.yaml"
    agent = {"name": "gpu-agent", "host": "127.0.0.1", "slots": [slot]}
    cluster.write_text(
        yaml.safe_dump({"resource_pools": [{"name": "default", "agents": [agent]}]})
    )
    db = f"sqlite:///{tmp / 'sweep.db'}"
    run_to_end(
        ["run", str(experiment), "--db", db, "--cluster", str(cluster)], cli_environment(), tmp
    )
    probes = {
        int(path.stem.split("-")[1]): json.loads(path.read_text())
        for path in probe_dir.glob("trial-*.json")
    }
    return ShareSearch(db, probes, slot)


@pytest.fixture(scope="module")
def quarters(tmp_path_factory: pytest.TempPathFactory) -> ShareSearch:
    return _share_search(
        tmp_path_factory.mktemp("gpu-quarters"),
        trials=QUARTERS,
        data={"together": QUARTERS, "wait_s": 120},
    )


@pytest.mark.gpu
def test_four_quarter_trials_share_one_gpu_capped_and_all_complete(quarters: ShareSearch) -> None:
    with session_scope(quarters.db) as session:
        ended = [(t.state, t.error) for t in session.scalars(select(Trial))]
    assert [state for state, _ in ended] == [TrialState.COMPLETED] * QUARTERS, ended
    assert sorted(quarters.probes) == list(range(QUARTERS))
    uuid = nvml_uuids()[quarters.slot]
    for number, probe in quarters.probes.items():
        # Only its slot's GPU, as one device: the physical GPU NVML numbers as the slot.
        assert probe["cuda_visible_devices"] == str(quarters.slot) == probe["slotsweep_slots"]
        assert probe["device_count"] == 1
        assert normalise_uuid(probe["device_uuid"]) == uuid, number
        assert probe["share"] == "0.25"
        # Its memory is capped at its quarter of the GPU.
        assert probe["memory_fraction"] in (None, 0.25)
        assert not probe["over_share_allocates"], probe
        assert probe["under_share_allocates"], probe


@pytest.mark.gpu
def test_with_mps_each_quarter_gets_a_quarter_of_the_threads(quarters: ShareSearch) -> None:
    if not mps_running():
        pytest.skip(
            "the CUDA MPS control daemon does not run here (no control pipe): share trials "
            "time-share the GPU; start it with `nvidia-cuda-mps-control -d` to check this"
        )
    assert {probe["mps_threads"] for probe in quarters.probes.values()} == {"25"}


@pytest.mark.gpu
def test_a_trial_over_its_share_fails_with_one_line_and_its_neighbour_completes(
    tmp_path: Path,
) -> None:
    search = _share_search(
        tmp_path, trials=2, data={"greedy_trials": [0], "greedy_fraction": 0.5, "wait_s": 0}
    )
    with session_scope(search.db) as session:
        trials = {t.optuna_trial_number: t for t in session.scalars(select(Trial))}
        failures = list(session.scalars(select(TrialFailure)))
        states = {number: trial.state for number, trial in trials.items()}
        error = trials[0].error or ""
    assert states == {0: TrialState.ERROR, 1: TrialState.COMPLETED}
    (failure,) = failures
    assert failure.exception_type == "ShareMemoryExceeded"
    line = failure.message
    assert "\n" not in line
    assert line.startswith("CUDA out of memory above this trial's memory cap of ")
    assert f"its share 1/4 of GPU {search.slot}" in line
    assert "resources.slots_per_trial 0.25" in line
    assert "CUDA out of memory above this trial's memory cap" in error
