"""Searches on a real two-node Slurm cluster (``.ci/slurm.sh``), one ``sbatch`` job per trial.

The driver runs outside any allocation, as on a login node, with a cluster file that
names the partition (``executor: slurm`` and a ``slurm:`` block); Slurm places every
attempt as a job of its own, and the ranks on the nodes write to PostgreSQL on the
bridge address. The nodes have 2 CPUs each and trials use CPU slots (``slot_type:
cpu``), so valid sizes are 1, 2 (one node) and 4 (both nodes, whole).
"""

from __future__ import annotations

import contextlib
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from searcher.driver.outcomes import PORT_CLASH_NOTE
from storage import (
    Checkpoint,
    Metric,
    ProcessRole,
    Trial,
    TrialFailure,
    TrialProcess,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.conftest import cli_environment
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
from trials.executors._slurm_commands import rendezvous_port

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _login_env(cluster: SlurmCluster, folder: Path, partition: str) -> dict[str, str]:
    """A login node's environment: the Slurm client settings and a cluster file, no job."""
    cluster_file = folder / f"cluster-{partition}.yaml"
    cluster_file.write_text(
        yaml.safe_dump(
            {
                "executor": "slurm",
                "slurm": {"partition": partition, "time_limit": "30", "slot_type": "cpu"},
            }
        )
    )
    env = {k: v for k, v in cli_environment().items() if not k.startswith("SLURM_")}
    return {**env, **cluster.env, "SLOTSWEEP_CLUSTER": str(cluster_file)}


@pytest.fixture
def login_env(slurm_cluster: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    """Trials as jobs of partition ``debug``."""
    return _login_env(slurm_cluster, tmp_path, "debug")


def _search(tmp_path: Path, **overrides: Any) -> Path:
    return write_experiment(tmp_path / "exp", **overrides)


def _slow_search(tmp_path: Path) -> Path:
    """One slow trial of 2 slots (one node) that checkpoints every epoch (about 5 s)."""
    return _search(
        tmp_path,
        entrypoint="slow_model:SlowDigitsTrial",
        data={"batch_delay_s": 0.2},
        resources={"slots_per_trial": 2},
        searcher={"max_trials": 1, "max_length": {"epochs": 3}},
    )


def _job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    job = cluster.job(job_id)
    assert job, f"slurmctld does not know job {job_id}"
    return job


def _first_job(database: str) -> str:
    with session_scope(database) as session:
        run = session.scalars(select(TrialRun).order_by(TrialRun.id)).first()
        assert run is not None and run.external_id
        return run.external_id


def test_each_trial_is_a_job_of_its_own_and_one_of_four_slots_takes_both_nodes(
    tmp_path: Path, login_env: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    # Two trials of 4 slots at once: each needs both nodes whole, so the second waits
    # in Slurm's queue while the first runs.
    path = _search(
        tmp_path,
        resources={"slots_per_trial": 4},
        searcher={"max_trials": 2, "max_concurrent_trials": 2},
        max_restarts=0,
    )
    # The rendezvous port of the first trial's first attempt is taken, on whichever
    # node hosts its store: the trial starts again at once, on another port, and
    # counts no restart (it would fail with max_restarts 0).
    taken = rendezvous_port("slotsweep-1-0")
    assert taken not in (rendezvous_port("slotsweep-1-1"), rendezvous_port("slotsweep-2-0"))
    with contextlib.ExitStack() as stack:
        for node, _ in slurm_cluster.nodes:
            stack.enter_context(slurm_cluster.port_taken(node, taken))
        output = run_to_end(["run", str(path), "--db", slurm_database], login_env, tmp_path)
    assert f"trial 1.0: {PORT_CLASH_NOTE}" in output, output[-3000:]

    with session_scope(slurm_database) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        # Finished, by the pruner or to the end (the pruner may stop the worse one).
        assert all(t.state in (TrialState.COMPLETED, TrialState.PRUNED) for t in trials), [
            t.error for t in trials
        ]
        assert [t.restarts for t in trials] == [0, 0]
        (failure,) = session.scalars(select(TrialFailure))
        assert failure.rank == TrialFailure.TORCHRUN_RANK and f"port: {taken}," in failure.message
        clashed = session.get(TrialRun, failure.run_id)
        assert clashed is not None and clashed.reason == PORT_CLASH_NOTE
        assert (clashed.trial_id, clashed.attempt) == (trials[0].id, 0) == (1, 0)
        runs = [
            run
            for run in session.scalars(select(TrialRun).order_by(TrialRun.id))
            if run.id != clashed.id
        ]
        assert len(runs) == 2 and all(r.executor == "sbatch" for r in runs)
        job_ids = [r.external_id for r in runs]
        assert all(j and j.isdigit() for j in job_ids) and len(set(job_ids)) == 2
        for run in runs:
            assert sorted(a["agent"] for a in run.agents) == ["ssnode1", "ssnode2"]
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        for trial in trials:
            mine = [r for r in ranks if r.trial_id == trial.id]
            # World size 4: two ranks on each node.
            assert sorted(r.rank for r in mine) == [0, 1, 2, 3]
            assert {r.host for r in mine} == {"ssnode1", "ssnode2"}
            assert trial.searcher_metric_value is not None
        assert session.scalars(select(Metric).where(Metric.name == "val_loss")).first()
        tokens = [r.launch_token for r in runs]
    for job_id, token in zip(job_ids, tokens, strict=True):
        assert job_id is not None
        job = _job(slurm_cluster, job_id)
        assert job["Partition"] == "debug" and job["NumNodes"] == "2", job
        assert job["JobName"] == f"slotsweep-{token}" and job["JobState"] == "COMPLETED", job
    logs = "".join(Path(str(t.log_path)).read_text() for t in trials)
    assert re.search(r"queued in Slurm as job \d+", logs), logs[-3000:]
    assert "[rank 3]" in logs
    assert_search_consistent(slurm_database)


def test_a_size_no_node_of_the_partition_can_hold_is_refused_with_the_valid_sizes(
    tmp_path: Path, login_env: dict[str, str], slurm_database: str
) -> None:
    path = _search(tmp_path, resources={"slots_per_trial": 3})
    done = run_cli(["run", str(path), "--db", slurm_database], login_env, tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "slots_per_trial" in done.stderr and "1, 2, 4" in done.stderr, done.stderr


def test_a_cluster_file_with_a_bad_slurm_block_names_the_field(
    tmp_path: Path, login_env: dict[str, str], slurm_database: str
) -> None:
    cluster_file = tmp_path / "bad.yaml"
    cluster_file.write_text(
        yaml.safe_dump(
            {
                "executor": "slurm",
                "slurm": {
                    "partition": "debug",
                    "time_limit": "4 hours",
                    "sbatch_options": ["--nodes=3"],
                },
            }
        )
    )
    path = _search(tmp_path)
    done = run_cli(
        ["run", str(path), "--db", slurm_database, "--cluster", str(cluster_file)],
        login_env,
        tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "slurm.time_limit" in done.stderr and "slurm.sbatch_options" in done.stderr
    # Valid in form, but a partition this cluster does not have: one line, from sinfo.
    cluster_file.write_text(
        yaml.safe_dump({"executor": "slurm", "slurm": {"partition": "nosuch", "time_limit": "5"}})
    )
    done = run_cli(
        ["run", str(path), "--db", slurm_database, "--cluster", str(cluster_file)],
        login_env,
        tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"cluster {cluster_file}: slurm.partition: nosuch: sinfo lists no nodes"
    ], done.stderr


def test_scancel_of_a_trial_job_restarts_it_then_resume_cancels_a_dead_driver_s_job(
    tmp_path: Path, login_env: dict[str, str], slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    """One trial meets both faults of a trial job, one per attempt (once two tests, each
    with a search of its own):

    - attempt 0: its job is cancelled (``scancel``) after a checkpoint, a failure of the
      attempt: one restart, from the checkpoint, as a job of its own;
    - attempt 1: its driver is SIGKILLed while it trains; the job outlives the driver
      until ``resume`` cancels it and finishes.
    """
    path = _search(
        tmp_path,
        entrypoint="slow_model:SlowDigitsTrial",
        # About 5 s an epoch: the restart still trains when its driver is killed.
        data={"batch_delay_s": 0.2},
        hyperparameters={"global_batch_size": 64},
        resources={"slots_per_trial": 2},
        searcher={"max_trials": 1, "max_length": {"epochs": 3}, "pruner": {"name": "none"}},
    )
    driver = start_cli(["run", str(path), "--db", slurm_database], login_env, tmp_path)

    def restart_trains() -> bool:
        with session_scope(slurm_database) as session:
            return bool(
                session.scalars(
                    select(TrialRun).where(
                        TrialRun.attempt == 1, TrialRun.progress_at.is_not(None)
                    )
                ).first()
            )

    try:
        wait_for(
            lambda: completed_checkpoints(slurm_database) > 0, timeout=300, what="a checkpoint"
        )
        job_id = _first_job(slurm_database)
        slurm_cluster.run("scancel", job_id, timeout=60)
        wait_for(restart_trains, timeout=300, what="the restart training")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=30)
    assert _job(slurm_cluster, job_id)["JobState"] == "CANCELLED"
    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        # A cancelled job is a failure of the attempt: one restart, from the checkpoint.
        assert trial.restarts == 1 and "CANCELLED" in str(trial.error), trial.error
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        assert [r.attempt for r in runs] == [0, 1]
        assert runs[0].external_id == job_id and runs[1].external_id != job_id
        assert runs[1].restored_from_step is not None
        left = str(runs[1].external_id)
    # The restart's job outlives its driver.
    assert _job(slurm_cluster, left)["JobState"] == "RUNNING"

    run_to_end(["resume", "1", "--db", slurm_database], login_env, tmp_path)
    assert _job(slurm_cluster, left)["JobState"] not in ("RUNNING", "PENDING")
    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.state == TrialState.COMPLETED, trial.error
        (killed,) = session.scalars(select(TrialRun).where(TrialRun.external_id == left))
        assert killed.ended_at is not None
    assert_search_consistent(slurm_database)


def test_a_preempted_trial_job_checkpoints_and_resumes_without_counting_a_failure(
    tmp_path: Path, slurm_database: str, slurm_cluster: SlurmCluster
) -> None:
    # Partition "grace" gives a preempted job 30 s after its SIGTERM (GraceTime).
    login_env = _login_env(slurm_cluster, tmp_path, "grace")
    driver = start_cli(
        ["run", str(_slow_search(tmp_path)), "--db", slurm_database], login_env, tmp_path
    )
    urgent = ""
    try:
        wait_for(
            lambda: completed_checkpoints(slurm_database) > 0, timeout=300, what="a checkpoint"
        )
        job_id = _first_job(slurm_database)
        # A job of the higher-priority partition on both nodes preempts the trial's.
        done = slurm_cluster.run(
            "sbatch",
            "--parsable",
            "-p",
            "urgent",
            "-N2",
            "--exclusive",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 5",
            timeout=60,
        )
        urgent = done.stdout.strip()
        assert urgent.isdigit(), done.stderr
        out, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
        if urgent:
            slurm_cluster.run("scancel", urgent, timeout=60)
    assert driver.returncode == 0, f"{out}\n{err}"
    with session_scope(slurm_database) as session:
        (trial,) = session.scalars(select(Trial))
        log = Path(str(trial.log_path)).read_text()
        assert trial.state == TrialState.COMPLETED, trial.error
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        preempted = [
            i for i, r in enumerate(runs) if "resumes from its latest checkpoint" in str(r.reason)
        ]
        assert len(preempted) == 1, [(r.attempt, r.reason) for r in runs]
        # The preemption is no failure: restarts count only attempts that failed on their
        # own (torchrun's start-up can lose a race for its free port, EADDRINUSE, on a
        # loaded machine; such an attempt is a failure and counts, as it should).
        failed = [r for r in runs[:-1] if r is not runs[preempted[0]]]
        assert trial.restarts == len(failed), f"{trial.error}\n{log[-4000:]}"
        assert all("EADDRINUSE" in str(r.reason) + str(trial.error) for r in failed), log[-4000:]
        stopped, resumed = runs[preempted[0]], runs[preempted[0] + 1]
        # The ranks took the SIGTERM as a stop request and wrote a checkpoint in the
        # grace time: the next job started from the newest checkpoint of the first.
        assert stopped.stop_requested_at is not None
        newest = max(
            c.step
            for c in session.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial.id))
            if c.step <= (resumed.restored_from_step or -1)
        )
        assert resumed.restored_from_step == newest
    # Whether the ranks were done before the grace time ran out decides which.
    assert _job(slurm_cluster, job_id)["JobState"] in ("PREEMPTED", "TIMEOUT", "COMPLETED")
    assert_search_consistent(slurm_database)
