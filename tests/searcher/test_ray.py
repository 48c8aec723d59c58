"""Searches on a real three-node Ray cluster (``.ci/ray.sh``): the Ray executor end to end.

The driver runs in the root namespace and reaches the cluster through Ray Client; the
agents are the two worker nodes (2 CPU slots each; the head has none), every attempt
is a placement group of one bundle per node and one actor per node running that
node's ``torchrun``, and every rank writes to PostgreSQL on the bridge address.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from storage import (
    Allocation,
    Checkpoint,
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
from tests.ray_cluster import RayCluster
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    run_cli,
    run_to_end,
    start_cli,
    wait_for,
    write_experiment,
)

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _search(tmp_path: Path, **overrides: Any) -> Path:
    """The digits search with trials of 4 slots (both worker nodes) unless told otherwise."""
    overrides.setdefault("resources", {"slots_per_trial": 4})
    return write_experiment(tmp_path / "exp", **overrides)


def _env(ray_cluster: RayCluster, tmp_path: Path, **ray: object) -> dict[str, str]:
    env = cli_environment()
    env["SLOTSWEEP_CLUSTER"] = str(ray_cluster.cluster_file(tmp_path, **ray))
    return env


@pytest.fixture
def ray_bucket(
    ray_cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on an S3 server on the bridge address, which the nodes reach; its URL and
    the credentials' environment (also set in this process)."""
    yield from bridge_bucket(ray_cluster.controller_address, "ray", tmp_path / "s3", monkeypatch)


def test_trials_span_both_worker_nodes_on_one_warm_job_and_a_size_no_node_holds_is_refused(
    tmp_path: Path, ray_cluster: RayCluster, ray_database: str
) -> None:
    env = _env(ray_cluster, tmp_path)
    refused = run_cli(
        [
            "run",
            str(_search(tmp_path / "big", resources={"slots_per_trial": 3})),
            "--db",
            ray_database,
        ],
        env,
        tmp_path,
    )
    assert refused.returncode == 2, refused.stderr
    # Two worker nodes of 2 CPU slots: sizes 1, 2 (one node) and 4 (both, whole).
    assert "1, 2, 4" in refused.stderr, refused.stderr

    # Two trials on one warm job: its ranks (across both nodes, one process group over
    # the bridge) run the second trial too.
    path = _search(
        tmp_path,
        resources={"slots_per_trial": 4, "reuse_workers": True},
        searcher={"max_trials": 2, "pruner": {"name": "none"}},
    )
    run_to_end(["run", str(path), "--db", ray_database], env, tmp_path)

    with session_scope(ray_database) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 2, [t.error for t in trials]
        assert all(t.searcher_metric_value is not None for t in trials)
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.id)))
        assert len(runs) == 2 and len({r.launch_token for r in runs}) == 1
        assert {r.executor for r in runs} == {"ray"}
        assert {r.external_id for r in runs} == {f"slotsweep-{runs[0].launch_token}"}
        assert sorted(a["agent"] for a in runs[0].agents) == ["raynode1", "raynode2"]
        (job,) = session.scalars(select(WarmJob))
        assert job.trials_run == 2 and job.ended_at is not None
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        # World size 4 on gloo: two ranks on each worker node, each on its own host.
        assert sorted({r.rank for r in ranks}) == [0, 1, 2, 3]
        assert {r.host for r in ranks} == {"raynode1", "raynode2"}
        assert all(r.ended_at is not None for r in ranks)
        assert session.scalars(select(Metric).where(Metric.name == "val_loss")).first()
        # The job's slots left the ledger with it.
        assert not session.scalars(select(Allocation)).first()
    log = Path(str(trials[0].log_path)).read_text()
    assert "[rank 3]" in log and "[rank 0]" in log
    assert re.search(r"NCCL and gloo use network interface \S+", log), log[-2000:]
    assert not ray_cluster.leftover_actors()
    assert_search_consistent(ray_database)


def _runs(db: str) -> list[TrialRun]:
    with session_scope(db) as session:
        runs = list(
            session.scalars(select(TrialRun).order_by(TrialRun.trial_id, TrialRun.attempt))
        )
        session.expunge_all()
    return runs


def test_a_lost_node_fails_the_attempt_and_the_trial_resumes_on_the_other_node_from_a_bucket(
    tmp_path: Path,
    ray_cluster: RayCluster,
    ray_database: str,
    ray_bucket: tuple[str, dict[str, str]],
) -> None:
    bucket, credentials = ray_bucket
    # A short reservation timeout: a restart placed on the lost node before Ray has
    # marked it dead waits for its placement group that long, then goes back to the queue.
    # The credentials are the driver's only (the nodes' Ray has none): the executor
    # passes them on to the ranks.
    env = {**_env(ray_cluster, tmp_path, reserve_timeout_s=10), **credentials}
    # Checkpoints in the bucket, no shared folder: the restart on the other node
    # restores what the lost node wrote there.
    path = _search(
        tmp_path,
        entrypoint="slow_model:SlowDigitsTrial",
        resources={"slots_per_trial": 2},
        # Three epochs (about 6 s) after the first checkpoint: the node is lost while the
        # trial still trains (with two left, a loaded machine once saw the trial end first).
        searcher={"max_trials": 1, "max_length": {"epochs": 4}},
        checkpoint_storage={"path": f"{bucket}/sweeps"},
    )
    driver = start_cli(["run", str(path), "--db", ray_database], env, tmp_path)
    lost = ""
    try:
        wait_for(lambda: completed_checkpoints(ray_database) > 0, timeout=300, what="a checkpoint")
        (run,) = _runs(ray_database)
        (lost,) = [agent["agent"] for agent in run.agents]
        ray_cluster.stop_node(lost)
        out, err = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
        if lost:
            ray_cluster.start_node(lost)
    assert driver.returncode == 0, f"{out}\n{err}"
    runs = _runs(ray_database)
    with session_scope(ray_database) as session:
        (trial,) = session.scalars(select(Trial))
        assert trial.state == TrialState.COMPLETED, trial.error
        assert trial.restarts == 1
    finished = runs[-1]
    assert [agent["agent"] for agent in finished.agents] != [lost]
    assert finished.restored_from_step, [(r.attempt, r.reason) for r in runs]
    log = Path(str(trial.log_path)).read_text()
    assert f"Ray node {lost} lost its actor" in log, log[-3000:]
    with session_scope(ray_database) as session:
        paths = list(session.scalars(select(Checkpoint.path)))
    assert paths and all(p.startswith(f"{bucket}/sweeps/") for p in paths), paths
    assert not (tmp_path / "exp" / "checkpoints").exists()
    assert S3_SECRET not in log
    assert_search_consistent(ray_database)


def test_two_searches_share_no_slot_skip_a_node_another_ray_job_holds_and_requeue_unreservable_groups(
    tmp_path: Path, ray_cluster: RayCluster, ray_database: str
) -> None:
    (address,) = [address for name, address in ray_cluster.nodes if name == "raynode1"]
    env = _env(ray_cluster, tmp_path, reserve_timeout_s=5)
    # Another Ray user holds raynode2's two CPUs for the whole test: raynode2 is not
    # offered. It also holds raynode1's placement pin (the node: resource every bundle
    # takes a sliver of), which slotsweep's view of the free slots does not show: Ray
    # cannot reserve a group on raynode1, as when a node's slots are taken between the
    # scheduler's decision and the reservation, until the pin is released.
    with ray_cluster.other_job(
        cpus={"num_cpus": 2, "resources": {"host_raynode2": 1}},
        pin={"num_cpus": 0, "resources": {f"node:{address}": 1}},
    ) as other:
        # Two drivers, one database, the same two slots wanted.
        drivers = [
            start_cli(
                [
                    "run",
                    str(
                        _search(
                            tmp_path / name,
                            name=name,
                            resources={"slots_per_trial": 2},
                            # A few batches: what is tested is where and when it runs.
                            searcher={
                                "max_trials": 1,
                                "max_length": {"batches": 4},
                                "pruner": {"name": "none"},
                            },
                            min_validation_period={"epochs": None, "batches": 4},
                            min_checkpoint_period={"epochs": None, "batches": 4},
                        )
                    ),
                    "--db",
                    ray_database,
                ],
                env,
                tmp_path,
            )
            for name in ("first", "second")
        ]

        def given_up() -> bool:
            stopped = [driver.communicate() for driver in drivers if driver.poll() is not None]
            assert not stopped, stopped
            return any("did not reserve" in (run.reason or "") for run in _runs(ray_database))

        try:
            wait_for(given_up, timeout=300, what="a placement group given up")
            other.release("pin")
            ended = [driver.communicate(timeout=600) for driver in drivers]
        finally:
            for driver in drivers:
                if driver.poll() is None:
                    driver.kill()
    for driver, (out, err) in zip(drivers, ended, strict=True):
        assert driver.returncode == 0, f"{out}\n{err}"

    runs = _runs(ray_database)
    with session_scope(ray_database) as session:
        trials = {t.id: t for t in session.scalars(select(Trial))}
        assert [t.state for t in trials.values()] == [TrialState.COMPLETED] * 2, [
            t.error for t in trials.values()
        ]
        # Given back to the queue, not failed: no restart counted.
        assert [t.restarts for t in trials.values()] == [0, 0]
        ranks = list(
            session.scalars(select(TrialProcess).where(TrialProcess.role == ProcessRole.RANK))
        )
        session.expunge_all()
    assert {r.host for r in ranks} == {"raynode1"}
    assert all([a["agent"] for a in run.agents] == ["raynode1"] for run in runs)
    given_up = [run for run in runs if "did not reserve" in (run.reason or "")]
    assert given_up and given_up[0].reason.startswith(
        "Ray did not reserve its slots on raynode1 (placement group PENDING) within 5 s"
    ), given_up[0].reason
    log = Path(str(trials[given_up[0].trial_id].log_path)).read_text()
    assert "Ray did not reserve its slots on raynode1" in log, log[-2000:]
    # Each trial ran once, on slots the other search's trial was not holding.
    assert_search_consistent(ray_database)
