"""The Slurm job executor: each trial attempt is its own ``sbatch`` job in a partition.

For shared clusters where holding an idle allocation is not allowed. The cluster
file's ``slurm:`` block names the partition, account, time limit (and optionally
QoS, constraint and more sbatch options); the agents are the partition's nodes as
``sinfo`` lists them, which is what decides the valid ``slots_per_trial`` at
submission. Slurm, not our scheduler, picks each job's nodes: a trial on one node
asks for its GPUs (or CPUs), a trial on several takes whole nodes (``--exclusive``).
The job runs one ``srun`` step of the node wrapper (:mod:`trials.node.cluster_node`)
on each of its nodes, with c10d rendezvous on its first node.

State comes from ``squeue`` (one call for all of a driver's jobs, cached briefly)
and, once a job has left the queue, from ``scontrol show job``. A job is named after
its attempt's launch token, so a later driver finds a crashed one's jobs by name.

Preemption and time limits: the trial's processes take SIGTERM as "checkpoint and
stop" (``SLOTSWEEP_CHECKPOINT_ON_SIGTERM``): Slurm's grace time (``GraceTime`` for
preemption, ``KillWait`` at the time limit) is spent writing a checkpoint, and the
driver resubmits the trial from it as its next attempt, not counted as a failure.
Jobs are submitted ``--no-requeue``: one attempt is one job, and the trial goes back
to the driver's queue instead of Slurm's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trials.executors._base import JobEnding
from trials.executors._process_rows import mark_processes_ended
from trials.executors._slurm import SlurmError, hostnames, slurm_command
from trials.executors._slurm_commands import (
    SINFO_NODE_FORMAT,
    JobStatus,
    batch_script,
    nodes_meeting,
    partition_nodes,
    rendezvous_port,
    sacct_job,
    sbatch_argv,
    show_job,
    squeue_jobs,
    step_name,
)
from trials.launch.launcher import (
    CHECKPOINT_ON_SIGTERM_ENV_VAR,
    SPEC_ENV_VAR,
    torchrun_args,
    trial_environment,
)
from trials.node.cluster_node import IFNAME_ENV_VAR, RDZV_PORT_ENV_VAR
from trials.scheduler import (
    DEFAULT_POOL,
    Agent,
    Cluster,
    ClusterConfigError,
    ResourcePool,
    SlotType,
    SlurmJobSettings,
    job_shape,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import TrialRun
    from trials.executors._base import LaunchRequest

# squeue is asked at most this often for all of a driver's jobs (slurmctld serves
# many users; the driver's tick is faster than anything a job does).
_STATUS_TTL_S = 1.0
_GONE_WAIT_S = 30.0


def partition_cluster(
    settings: SlurmJobSettings,
    *,
    slot_type: SlotType | None = None,
    dtrain_network_interface: str | None = None,
) -> Cluster:
    """The partition's nodes as the agents of pool ``default`` (from ``sinfo``).

    A node's slots are its GPUs (``slot_type: gpu``, the default when the nodes have
    GPUs) or its CPUs. Nodes that the constraint rules out are left out.

    It asks the cluster's Slurm controller (``sinfo``), so it runs only where one
    answers; for partition ``gpu`` and a 60-minute time limit::

        cluster = partition_cluster(SlurmJobSettings("gpu", "60"))
        cluster.executor  # 'sbatch'
    """
    where = f"slurm.partition: {settings.partition}"
    try:
        sinfo = slurm_command(
            ["sinfo", "-h", "-N", "-p", settings.partition, "-o", SINFO_NODE_FORMAT]
        )
    except SlurmError as exc:
        raise ClusterConfigError([f"{where}: {exc}"]) from None
    nodes = nodes_meeting(partition_nodes(sinfo), settings.constraint)
    if not nodes:
        raise ClusterConfigError(
            [
                f"{where}: sinfo lists no nodes"
                + (f" with {settings.constraint}" if settings.constraint else "")
            ]
        )
    if slot_type is None:
        slot_type = "gpu" if any(node.gpus for node in nodes) else "cpu"
    if slot_type == "gpu" and not any(node.gpus for node in nodes):
        raise ClusterConfigError(
            ["slurm.slot_type: gpu, but no node of the partition has GPUs; use slot_type: cpu"]
        )
    agents = tuple(
        Agent(
            name=node.name,
            host=node.address,
            slots=tuple(range(node.gpus if slot_type == "gpu" else node.cpus)),
        )
        for node in nodes
    )
    return Cluster(
        pools=(ResourcePool(name=DEFAULT_POOL, agents=agents),),
        executor="sbatch",
        dtrain_network_interface=dtrain_network_interface,
        gpu_slots=slot_type == "gpu",
        slurm_jobs=SlurmJobSettings(
            partition=settings.partition,
            time_limit=settings.time_limit,
            account=settings.account,
            qos=settings.qos,
            constraint=settings.constraint,
            sbatch_options=settings.sbatch_options,
            slot_type=slot_type,
        ),
    )


def _jobs_named(name: str) -> list[str]:
    """The ids of the jobs called ``name`` that Slurm still lists (pending, running, ending)."""
    return slurm_command(["squeue", "-h", "-n", name, "-o", "%i"]).split()


def _cancel_jobs(job_ids: Sequence[str], *, grace_s: float) -> bool:
    """SIGTERM (the trial checkpoints), ``grace_s``, then cancel; whether all are gone."""
    listed = list(job_ids)

    def still_listed() -> list[str]:
        if not listed:
            return []
        return list(squeue_jobs(_squeue(listed)))

    try:
        if listed and grace_s > 0:
            slurm_command(["scancel", "--signal=TERM", "--full", *listed], check=False)
            deadline = time.monotonic() + grace_s
            while listed and time.monotonic() < deadline:
                time.sleep(0.5)
                listed = still_listed()
        if listed:
            slurm_command(["scancel", "--signal=KILL", "--full", *listed], check=False)
            slurm_command(["scancel", *listed], check=False)
        deadline = time.monotonic() + _GONE_WAIT_S
        while listed and time.monotonic() < deadline:
            time.sleep(0.5)
            listed = still_listed()
    except SlurmError:
        return False
    return not listed


def _squeue(job_ids: Sequence[str]) -> str:
    # A job that left the queue is simply not listed (an unknown id alone fails).
    return slurm_command(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"], check=False
    )


def _ended_job(job_id: str) -> JobStatus:
    """How a job that left the queue ended: ``scontrol`` while slurmctld keeps it
    (``MinJobAge``), else the accounting database (``sacct``), else unknown (the
    trial's own record in our database still says whether it finished)."""
    try:
        ended = show_job(slurm_command(["scontrol", "-o", "show", "job", job_id], check=False))
        if ended is None:
            ended = sacct_job(
                job_id,
                slurm_command(
                    [
                        "sacct",
                        "-n",
                        "-X",
                        "-P",
                        "-j",
                        job_id,
                        "-o",
                        "JobID,State,ExitCode,NodeList",
                    ],
                    check=False,
                ),
            )
    except SlurmError:
        ended = None
    return ended or JobStatus(job_id, "UNKNOWN", exit_code=1)


@dataclass
class SbatchJob:
    """One attempt's Slurm job, as the driver that submitted it sees it."""

    executor: SbatchExecutor
    job_id: str
    name: str
    slots_per_node: int
    _ended: JobStatus | None = field(default=None, repr=False)

    @property
    def external_id(self) -> str | None:
        return self.job_id

    def _status(self) -> JobStatus | None:
        """The job while Slurm lists it; None once it left the queue."""
        return self.executor.listed_jobs().get(self.job_id)

    def poll(self) -> int | None:
        if self._ended is not None:
            return self._ended.exit_code if self._ended.exit_code is not None else 1
        if self._status() is not None:
            return None
        self._ended = _ended_job(self.job_id)
        self.executor.forget_statuses(ended=self.job_id)
        return self.poll()

    def waiting_reason(self) -> str | None:
        status = self._status() if self._ended is None else None
        if status is None or not status.pending:
            return None
        why = f": {status.reason}" if status.reason else ""
        return f"queued in Slurm as job {self.job_id}{why}"

    def ending(self) -> JobEnding:
        ended = self._ended
        if ended is None:
            return JobEnding()
        if ended.stopped_by_cluster:
            what = {"PREEMPTED": "preempted", "TIMEOUT": "at its time limit"}.get(
                ended.state, ended.state.lower()
            )
            return JobEnding(stopped_by_cluster=f"Slurm job {self.job_id} {what}")
        if ended.state not in ("COMPLETED", "FAILED"):
            return JobEnding(cause=f"Slurm job {self.job_id} {ended.state}")
        return JobEnding()

    def end(self, *, grace_s: float) -> bool:
        if self._ended is not None:
            return True
        gone = _cancel_jobs([self.job_id], grace_s=grace_s)
        self.executor.forget_statuses()
        return gone

    def record(self, session: Session, run: TrialRun) -> None:
        run.external_id = self.job_id
        run.agents = self.describe()

    def describe(self) -> list[dict[str, Any]]:
        status = self._ended or self._status()
        if status is None or not status.nodes or status.pending:
            return []
        try:
            names = hostnames(status.nodes)
        except SlurmError:
            names = [status.nodes]
        slots = list(range(self.slots_per_node))
        return [{"agent": name, "host": name, "slots": slots} for name in names]


class SbatchExecutor:
    """Submits each attempt as one Slurm job (``cluster.slurm_jobs`` says how).

    Where a Slurm controller answers (``sbatch`` submits the job, so no example runs
    it here)::

        executor = SbatchExecutor(partition_cluster(settings))
        job = executor.launch(request)
    """

    name = "sbatch"
    remote = True
    places_trials = True
    # Slurm picks each job's GPUs, whole (gres), from a ledger of its own.
    shares_slots = False

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self._job_ids: set[str] = set()
        self._listed: tuple[float, dict[str, JobStatus]] | None = None

    def listed_jobs(self) -> dict[str, JobStatus]:
        """Every job of this executor that Slurm still lists (one squeue, cached briefly)."""
        now = time.monotonic()
        if self._listed is None or now - self._listed[0] > _STATUS_TTL_S:
            ids = sorted(self._job_ids)
            try:
                listed = squeue_jobs(_squeue(ids)) if ids else {}
            except SlurmError:
                # No answer: every job counts as still there (never as ended).
                listed = {job_id: JobStatus(job_id, "UNKNOWN") for job_id in ids}
            self._listed = (now, listed)
        return self._listed[1]

    def forget_statuses(self, *, ended: str | None = None) -> None:
        """Ask squeue again next time; ``ended``: a job not to ask about any more."""
        self._listed = None
        self._job_ids.discard(ended or "")

    def launch(self, request: LaunchRequest) -> SbatchJob:
        cluster = self.cluster
        if cluster is None or cluster.slurm_jobs is None:
            raise RuntimeError("the sbatch executor needs the cluster file's slurm block")
        settings = cluster.slurm_jobs
        nodes, slots_per_node = job_shape(cluster.pool(DEFAULT_POOL), request.slots)
        torchrun = torchrun_args(
            nnodes=nodes,
            nproc_per_node=slots_per_node,
            rdzv_endpoint=None,
            rdzv_id=request.rdzv_id,
        )
        name = step_name(request.token)
        argv = sbatch_argv(
            settings,
            nodes=nodes,
            slots_per_node=slots_per_node,
            use_gpus=settings.slot_type == "gpu",
            name=name,
            log_path=str(request.log_path.resolve()),
        )
        node_env = {
            SPEC_ENV_VAR: request.spec_json,
            CHECKPOINT_ON_SIGTERM_ENV_VAR: "1",
            RDZV_PORT_ENV_VAR: str(rendezvous_port(request.rdzv_id)),
        }
        if cluster.dtrain_network_interface:
            node_env[IFNAME_ENV_VAR] = cluster.dtrain_network_interface
        env = trial_environment(request.token, {**request.env, **node_env})
        # The job gets Slurm's own SLURM_* values; a driver inside another job must
        # not hand it those of its own (SLURM_CONF says which cluster, and stays).
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = slurm_command(argv, stdin=batch_script(torchrun), env=env, cwd=request.cwd)
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: no job id in its answer {out.strip()!r}")
        self._job_ids.add(job_id)
        self.forget_statuses()
        return SbatchJob(self, job_id=job_id, name=name, slots_per_node=slots_per_node)

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        if not run.launch_token:
            return True
        try:
            found = _jobs_named(step_name(run.launch_token))
        except SlurmError:
            return False
        gone = _cancel_jobs(found, grace_s=grace_s)
        if gone:
            mark_processes_ended(session, run)
        return gone

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        if run.ended_at is not None or not run.launch_token:
            return True
        try:
            gone = not _jobs_named(step_name(run.launch_token))
        except SlurmError:
            return False
        if gone:
            mark_processes_ended(session, run)
        return gone

    def unavailable_agents(self, names: Sequence[str]) -> frozenset[str]:
        # Slurm places the jobs, around drained and lost nodes itself.
        return frozenset()
