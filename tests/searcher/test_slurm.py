"""Searches on a real two-node Slurm cluster (``.ci/slurm.sh``), inside an allocation.

Each test holds an allocation of both nodes (``salloc --no-shell``) and runs the
driver with that allocation's environment, as ``salloc slotsweep run ...`` would: the
agents are the allocation's nodes (2 CPU slots each), every trial attempt is one
``srun`` job step, and every rank writes to PostgreSQL on the bridge address. The
allocation outlives a killed driver, so the steps it left behind are there for
``resume`` to find.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage import (
    Allocation,
    Checkpoint,
    CheckpointState,
    Metric,
    ProcessRole,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    WarmJob,
    session_scope,
)
from tests.conftest import S3_SECRET, bridge_bucket, cli_environment
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    run_cli,
    run_to_end,
    start_cli,
    wait_for,
    write_experiment,
)
from tests.slurm_cluster import SlurmCluster
from trials import store_for
from trials.runtime._checkpoint import read_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture
def allocation(slurm_cluster: SlurmCluster) -> Iterator[dict[str, str]]:
    """Both nodes allocated to one job; the environment ``salloc`` gives its command."""
    # --no-kill: a lost node leaves the allocation instead of ending it.
    job_id = slurm_cluster.allocate(no_kill=True, name="slotsweep-search")
    env = {**cli_environment(), **slurm_cluster.allocation_env(job_id)}
    try:
        yield env
    finally:
        slurm_cluster.run("scancel", job_id, timeout=60)


def _steps(cluster: SlurmCluster, job_id: str) -> list[str]:
    done = cluster.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i %j", timeout=30)
    return [line.split()[0] for line in done.stdout.splitlines() if "slotsweep-" in line]


def _search(tmp_path: Path, **overrides: Any) -> Path:
    """The digits search with trials of 4 slots (both nodes) unless told otherwise."""
    overrides.setdefault("resources", {"slots_per_trial": 4})
    return write_experiment(tmp_path / "exp", **overrides)


def test_a_trial_spans_both_nodes_and_its_averaged_metrics_reach_postgresql(
    tmp_path: Path, allocation: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    path = _search(tmp_path, searcher={"max_trials": 1})
    run_to_end(["run", str(path), "--db", slurm_database], allocation, tmp_path)

    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.state == TrialState.COMPLETED, trial.error
        (run,) = session.scalars(select(TrialRun))
        assert run.executor == "slurm"
        assert run.external_id and re.fullmatch(
            rf"{allocation['SLURM_JOB_ID']}\.\d+", run.external_id
        )
        assert sorted(a["agent"] for a in run.agents) == ["ssnode1", "ssnode2"]
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        # World size 4: two ranks on each node, each on its own host.
        assert sorted(r.rank for r in ranks) == [0, 1, 2, 3]
        assert {r.host for r in ranks} == {"ssnode1", "ssnode2"}
        assert all(r.ended_at is not None for r in ranks)
        losses = session.scalars(select(Metric).where(Metric.name == "val_loss")).all()
        assert losses and trial.searcher_metric_value is not None
    log = Path(str(trial.log_path)).read_text()
    assert "[rank 3]" in log
    assert re.search(r"NCCL and gloo use network interface \S+", log), log[-2000:]
    assert not _steps(slurm_cluster, allocation["SLURM_JOB_ID"])


def test_a_cancelled_step_restarts_from_its_checkpoint_then_resume_cancels_a_dead_driver_s_step(
    tmp_path: Path, allocation: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    """One trial meets both faults of a step, one per attempt (once two tests, each with
    a search of its own):

    - attempt 0: its step is cancelled (``scancel``) after a checkpoint, a failure of the
      attempt: one restart, from the checkpoint, in a step of its own;
    - attempt 1: its driver is SIGKILLed while it trains; the step outlives the driver
      (``srun`` runs in a session of its own) until ``resume`` cancels it and finishes.
    """
    path = _search(
        tmp_path,
        entrypoint="slow_model:SlowDigitsTrial",
        searcher={"max_trials": 1, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
        # About 5 s an epoch: the restart still trains when its driver is killed.
        hyperparameters={"global_batch_size": 64},
        data={"batch_delay_s": 0.2},
    )
    job_id = allocation["SLURM_JOB_ID"]
    driver = start_cli(["run", str(path), "--db", slurm_database], allocation, tmp_path)

    def restart_trains() -> bool:
        with session_scope(slurm_database) as session:
            return bool(
                session.scalars(
                    select(TrialRun).where(
                        TrialRun.attempt == 1,
                        TrialRun.external_id.is_not(None),
                        TrialRun.progress_at.is_not(None),
                    )
                ).first()
            )

    try:
        wait_for(
            lambda: completed_checkpoints(slurm_database) > 0,
            timeout=300,
            what="the first checkpoint",
        )
        with session_scope(slurm_database) as session:
            (run,) = session.scalars(select(TrialRun))
            step_id = run.external_id
        assert step_id
        slurm_cluster.run("scancel", step_id, timeout=60)
        wait_for(restart_trains, timeout=300, what="the restart training")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=30)
    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.restarts == 1
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        assert [r.attempt for r in runs] == [0, 1]
        assert runs[1].restored_from_step is not None
        assert runs[0].external_id != runs[1].external_id
    # The step outlives its driver: srun runs in a session of its own.
    left = _steps(slurm_cluster, job_id)
    assert left, "the killed driver's step should still run"

    resumed = run_to_end(["resume", "1", "--db", slurm_database], allocation, tmp_path)
    assert not _steps(slurm_cluster, job_id)
    with session_scope(slurm_database) as session:
        trials = list(session.scalars(select(Trial)))
        # Finished to the end (no pruner), and none lost.
        assert [t.state for t in trials] == [TrialState.COMPLETED], [
            (t.state, t.error, t.restarts) for t in trials
        ] + [resumed]
        ended = list(session.scalars(select(TrialRun).where(TrialRun.external_id.in_(left))))
        assert ended and all(r.ended_at is not None for r in ended)
    assert_search_consistent(slurm_database)


def test_a_lost_node_restarts_the_trial_from_its_checkpoint_on_the_other_node(
    tmp_path: Path, allocation: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    path = _search(
        tmp_path,
        entrypoint="slow_model:SlowDigitsTrial",
        resources={"slots_per_trial": 2},
        # Three epochs (about 6 s) after the first checkpoint: the node is lost while the
        # trial still trains (Ray's case with two left once saw the trial end first).
        searcher={"max_trials": 1, "max_length": {"epochs": 4}},
    )
    driver = start_cli(["run", str(path), "--db", slurm_database], allocation, tmp_path)
    lost = ""
    try:
        wait_for(
            lambda: completed_checkpoints(slurm_database) > 0,
            timeout=300,
            what="the first checkpoint",
        )
        with session_scope(slurm_database) as session:
            (run,) = session.scalars(select(TrialRun))
            (lost,) = [a["agent"] for a in run.agents]
        slurm_cluster.stop_node(lost)
        try:
            out, err = driver.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            driver.kill()
            out, err = driver.communicate()
    finally:
        if driver.poll() is None:
            driver.kill()
        if lost:
            slurm_cluster.start_node(lost)
    with session_scope(slurm_database) as session:
        runs_seen = [
            (r.attempt, r.agents, r.exit_code, r.reason) for r in session.scalars(select(TrialRun))
        ]
        errors = [t.error for t in session.scalars(select(Trial))]
    assert driver.returncode == 0, f"{out}\n{err}\n{runs_seen}\n{errors}"
    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.state in (TrialState.COMPLETED, TrialState.PRUNED), trial.error
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        assert len(runs) == 2 and runs[1].restored_from_step is not None
        # The restart went to the node that is still in the allocation.
        assert [a["agent"] for a in runs[1].agents] != [lost]
    assert_search_consistent(slurm_database)


def test_warm_workers_run_every_trial_on_one_step_across_both_nodes(
    tmp_path: Path, allocation: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    # Warm workers inside an allocation: the first trial's srun step (4 ranks on two
    # nodes, one process group over the bridge) runs the later trials too.
    path = _search(
        tmp_path,
        resources={"slots_per_trial": 4, "reuse_workers": True},
        searcher={"max_trials": 3, "pruner": {"name": "none"}},
    )
    run_to_end(["run", str(path), "--db", slurm_database], allocation, tmp_path)

    with session_scope(slurm_database) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 3, [t.error for t in trials]
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.id)))
        assert len(runs) == 3 and len({r.launch_token for r in runs}) == 1
        assert len({r.external_id for r in runs}) == 1, [r.external_id for r in runs]
        (job,) = session.scalars(select(WarmJob))
        assert job.trials_run == 3 and job.ended_at is not None
        assert all(t.searcher_metric_value is not None for t in trials)
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        assert {r.host for r in ranks} == {"ssnode1", "ssnode2"}
        assert all(r.ended_at is not None for r in ranks)
        # The job's slots left the ledger with it.
        assert not session.scalars(select(Allocation)).first()
    assert not _steps(slurm_cluster, allocation["SLURM_JOB_ID"])
    assert_search_consistent(slurm_database)


def test_a_size_the_allocation_can_never_hold_is_refused_with_the_valid_sizes(
    tmp_path: Path, allocation: dict[str, str], slurm_database: str
) -> None:
    path = _search(tmp_path, resources={"slots_per_trial": 3})
    done = run_cli(["run", str(path), "--db", slurm_database], allocation, tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "slots_per_trial" in done.stderr and "1, 2, 4" in done.stderr, done.stderr


def test_sqlite_is_refused_when_ranks_run_on_other_nodes(
    tmp_path: Path, allocation: dict[str, str]
) -> None:
    path = _search(tmp_path)
    db = f"sqlite:///{tmp_path / 'search.db'}"
    done = run_cli(["run", str(path), "--db", db], allocation, tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "PostgreSQL" in done.stderr, done.stderr
    with contextlib.suppress(FileNotFoundError):
        assert (tmp_path / "search.db").stat().st_size == 0


@pytest.fixture
def slurm_bucket(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on an S3 server on the bridge address, which the nodes reach; its URL and
    the credentials' environment (also set in this process)."""
    yield from bridge_bucket(
        slurm_cluster.controller_address, "slurm", tmp_path / "s3", monkeypatch
    )


def test_a_trial_across_both_nodes_checkpoints_to_a_bucket(
    tmp_path: Path,
    allocation: dict[str, str],
    slurm_database: str,
    slurm_bucket: tuple[str, dict[str, str]],
) -> None:
    bucket, credentials = slurm_bucket
    # One epoch (one checkpoint) shows the bucket written from a two-node trial.
    path = _search(
        tmp_path,
        searcher={"max_trials": 1, "max_length": {"epochs": 1}, "pruner": {"name": "none"}},
        checkpoint_storage={"path": f"{bucket}/sweeps", "save_trial_latest": 1},
    )
    run_to_end(["run", str(path), "--db", slurm_database], {**allocation, **credentials}, tmp_path)

    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.state == TrialState.COMPLETED, trial.error
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        rows = list(session.scalars(select(Checkpoint).order_by(Checkpoint.id)))
        latest = [r.path for r in rows if r.state == CheckpointState.COMPLETED]
    assert {r.host for r in ranks} == {"ssnode1", "ssnode2"}
    assert rows and all(r.path.startswith(f"{bucket}/sweeps/") for r in rows)
    assert latest and all(store_for(p).is_complete(p) for p in latest)
    assert read_checkpoint(latest[-1])["kind"] == "managed"
    assert not (tmp_path / "exp" / "checkpoints").exists()
    assert S3_SECRET not in Path(str(trial.log_path)).read_text()
