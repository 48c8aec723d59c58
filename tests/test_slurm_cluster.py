"""The Slurm test cluster itself (``.ci/slurm.sh``, ``tests/slurm_cluster.py``).

Real daemons on network namespaces, checked for what Slurm tests of the product lean
on: two nodes of 2 CPUs, a torchrun world spread over both, a node process reaching
the test's PostgreSQL, scancel, the loss and return of a node (with the requeue of its
batch job), and preemption of a ``debug`` job by an ``urgent`` one.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import sqlalchemy as sa

from tests.conftest import REPO_ROOT, PostgresServer, free_port
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

T = TypeVar("T")

# A world of 4 (2 nodes x 2 ranks) adds rank + 1 with gloo: every rank must see 10.
ALLREDUCE = """\
import json, os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
record = {"rank": rank, "world": dist.get_world_size(), "sum": total.item(),
          "host": socket.gethostname()}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump(record, out)
dist.destroy_process_group()
"""

# Run on a node: insert this node's host name and the address PostgreSQL saw it come from.
INSERT_FROM_NODE = """\
import socket, sys
import sqlalchemy as sa

engine = sa.create_engine(sys.argv[1])
with engine.begin() as db:
    db.execute(sa.text("CREATE TABLE IF NOT EXISTS slurm_probe (host text, client text)"))
    db.execute(sa.text("INSERT INTO slurm_probe VALUES (:host, host(inet_client_addr()))"),
               {"host": socket.gethostname()})
"""


def wait_until(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``probe`` every 0.2 s until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s")
        time.sleep(0.2)


def processes_running(program: str, *args: str) -> list[psutil.Process]:
    """Processes on this machine (any namespace) running ``program`` (any folder) with ``args``.

    srun runs a program by its full path (``/usr/bin/sleep``).
    """
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline[:1] and Path(cmdline[0]).name == program and cmdline[1:] == list(args):
            found.append(process)
    return found


def submit(cluster: SlurmCluster, *argv: str) -> str:
    """``sbatch --parsable``; the job id."""
    done = cluster.run("sbatch", "--parsable", *argv)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_sinfo_lists_two_nodes_of_two_cpus(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %c %G")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["ssnode1 2 gpu:2", "ssnode2 2 gpu:2"]
    assert [name for name, _ in slurm_cluster.nodes] == ["ssnode1", "ssnode2"]
    partitions = slurm_cluster.run("sinfo", "-h", "-o", "%P").stdout.split()
    assert partitions == ["debug*", "grace", "urgent"]


def test_torchrun_world_of_four_across_two_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    node1_address = slurm_cluster.nodes[0][1]
    done = slurm_cluster.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{node1_address}:{free_port()}",
        str(script),
        str(tmp_path),
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert [record["rank"] for record in records] == [0, 1, 2, 3]
    assert {record["world"] for record in records} == {4}
    assert {record["sum"] for record in records} == {10.0}
    assert {record["host"] for record in records} == {"ssnode1", "ssnode2"}


def test_node_process_reaches_postgres(
    slurm_cluster: SlurmCluster, slurm_postgres: PostgresServer
) -> None:
    url = slurm_postgres.url.replace("postgresql://", "postgresql+psycopg://")
    name, address = slurm_cluster.nodes[1]
    done = slurm_cluster.run(
        "srun", "-N1", "-w", name, sys.executable, "-c", INSERT_FROM_NODE, url, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    engine = sa.create_engine(url)
    try:
        with engine.connect() as db:
            rows = db.execute(sa.text("SELECT host, client FROM slurm_probe")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [(name, address)]


def test_scancel_ends_a_running_job_and_a_running_step(slurm_cluster: SlurmCluster) -> None:
    # A job that srun created: scancel of the job ends srun, the job and its process.
    seconds = str(3000 + uuid.uuid4().int % 1000)
    name = f"scancel-{uuid.uuid4().hex[:8]}"
    srun = slurm_cluster.popen("srun", "-N1", "-J", name, "sleep", seconds)
    try:

        def running_job() -> str | None:
            line = slurm_cluster.run("squeue", "-h", "-n", name, "-o", "%i %T").stdout.split()
            return line[0] if line[1:] == ["RUNNING"] else None

        job_id = wait_until(running_job, 30, "running job")
        wait_until(lambda: processes_running("sleep", seconds), 30, "sleep process")
        assert slurm_cluster.run("scancel", job_id).returncode == 0
        srun.wait(timeout=30)
        wait_until(
            lambda: not slurm_cluster.run("squeue", "-h", "-j", job_id).stdout.strip(),
            30,
            "empty squeue",
        )
        assert slurm_cluster.job(job_id)["JobState"] == "CANCELLED"
        assert not processes_running("sleep", seconds)
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()

    # A step of a batch job: scancel JOB.0 ends that step only; the job runs on.
    step_seconds = str(int(seconds) + 1000)
    after_seconds = str(int(seconds) + 2000)
    job_id = submit(
        slurm_cluster,
        "-N1",
        "-o",
        "/dev/null",
        "--wrap",
        f"srun sleep {step_seconds}; sleep {after_seconds}",
    )
    try:
        wait_until(lambda: processes_running("sleep", step_seconds), 30, "step's sleep process")
        assert slurm_cluster.run("scancel", f"{job_id}.0").returncode == 0
        wait_until(lambda: processes_running("sleep", after_seconds), 30, "the job going on")
        wait_until(lambda: not processes_running("sleep", step_seconds), 10, "end of the step")
        steps = slurm_cluster.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i").stdout.split()
        assert f"{job_id}.0" not in steps
        assert slurm_cluster.job(job_id)["JobState"] == "RUNNING"
    finally:
        slurm_cluster.run("scancel", job_id)
    wait_until(lambda: slurm_cluster.job(job_id)["JobState"] == "CANCELLED", 30, "cancelled job")
    wait_until(lambda: not processes_running("sleep", after_seconds), 30, "end of the job")


def test_lost_node_is_noticed_its_batch_job_requeued_and_it_comes_back(
    slurm_cluster: SlurmCluster,
) -> None:
    name = slurm_cluster.nodes[1][0]
    seconds = str(3000 + uuid.uuid4().int % 1000)
    job_id = submit(
        slurm_cluster,
        "-N1",
        "-w",
        name,
        "--requeue",
        "-o",
        "/dev/null",
        "--wrap",
        f"sleep {seconds}",
    )
    try:
        wait_until(lambda: processes_running("sleep", seconds), 30, "job's sleep process")
        lost_at = time.monotonic()
        slurm_cluster.stop_node(name)
        assert not processes_running("sleep", seconds)
        # "*": slurmctld gets no answer; down*: it gave up on the node.
        slurm_cluster.wait_node_state(name, r"\w+\*|down.*", timeout=30)
        assert time.monotonic() - lost_at < 30
        slurm_cluster.wait_node_state(name, r"down\*", timeout=60)

        def requeued() -> dict[str, str] | None:
            job = slurm_cluster.job(job_id)
            return job if job.get("Restarts") == "1" else None

        job = wait_until(requeued, 30, "requeued job")
        assert job["JobState"] in ("PENDING", "RUNNING"), job
        slurm_cluster.start_node(name)
        assert slurm_cluster.node_state(name) in ("idle", "mix", "alloc")
    finally:
        slurm_cluster.run("scancel", job_id)
        slurm_cluster.start_node(name)  # a no-op when the node is back already


def test_urgent_job_preempts_and_requeues_a_debug_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    low = submit(
        slurm_cluster,
        "-N2",
        "-n4",
        "--requeue",
        "--open-mode=append",
        "-o",
        str(tmp_path / "low-%j.out"),
        "--wrap",
        "echo restarts=${SLURM_RESTART_COUNT:-0}; sleep 600",
    )
    try:
        wait_until(lambda: slurm_cluster.job(low)["JobState"] == "RUNNING", 30, "running job")
        high = submit(
            slurm_cluster,
            "-p",
            "urgent",
            "-N2",
            "-n4",
            "-o",
            str(tmp_path / "high-%j.out"),
            "--wrap",
            "echo urgent",
        )
        wait_until(lambda: slurm_cluster.job(high)["JobState"] == "COMPLETED", 60, "urgent job")
        job = slurm_cluster.job(low)
        assert job["Restarts"] == "1", job
        # Slurm holds a requeued job back (BeginTime) for a while; release it now, and
        # again while it waits: on a loaded CI run a single release was followed by a
        # minute of PENDING (its reason is in the failure below, should it come again).
        assert job["JobState"] == "PENDING", job
        deadline = time.monotonic() + 120
        while (job := slurm_cluster.job(low)).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, f"the requeued job never restarted: {job}"
            if job.get("JobState") == "PENDING":
                slurm_cluster.run("scontrol", "update", f"jobid={low}", "StartTime=now")
            time.sleep(3)
        output = tmp_path / f"low-{low}.out"
        wait_until(lambda: "restarts=1" in output.read_text(), 30, "restarted job's output")
        text = output.read_text()
        assert "restarts=0" in text
        assert "DUE TO PREEMPTION" in text
    finally:
        slurm_cluster.run("scancel", low)
