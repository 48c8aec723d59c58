"""The Slurm executor: each trial attempt is one ``srun`` job step of the search's allocation.

Run a search from inside ``salloc`` or ``sbatch`` (or with ``--cluster slurm``): the
agents are the allocation's nodes with the GPUs Slurm gave each of them (CPU slots on
CPU-only nodes), the scheduler places trials on them under the usual rules, and each
attempt runs as ``srun --nodes=k --ntasks-per-node=1 --nodelist=... --exact
--kill-on-bad-exit`` of one ``torchrun`` per node with c10d rendezvous on the first
node. The step's output comes back through ``srun`` (a child of the driver) to the
trial's log.

Every step is named after its attempt's launch token (:func:`step_name`): a driver that
starts after a crash finds the steps of the old one by name and cancels them with
``scancel``, and a step is confirmed gone when ``squeue`` no longer lists it. Its id
(``JOB.STEP``) is recorded in ``TrialRun.external_id``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trials.executors._base import JobEnding
from trials.executors._process_rows import mark_processes_ended
from trials.executors._slurm_commands import (
    expand_counts,
    gpu_indices,
    job_node_gres,
    node_addresses,
    rendezvous_port,
    srun_argv,
    step_name,
    steps_named,
    unavailable_nodes,
)
from trials.launch.launcher import SPEC_ENV_VAR, torchrun_args, trial_environment
from trials.node.cluster_node import (
    IFNAME_ENV_VAR,
    NODE_SLOTS_ENV_VAR,
    RDZV_HOST_ENV_VAR,
    RDZV_NODE_ENV_VAR,
)
from trials.scheduler import DEFAULT_POOL, Agent, Cluster, ClusterConfigError, ResourcePool

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import TrialRun
    from trials.executors._base import LaunchRequest

# Slurm's client commands answer in well under a second on a healthy controller.
_COMMAND_TIMEOUT_S = 30.0
# How long a started step gets to appear in squeue before its id is left unrecorded
# (the step name still finds it).
_STEP_ID_WAIT_S = 10.0
_GONE_WAIT_S = 10.0
_NODE_STATE_TTL_S = 2.0


class SlurmError(RuntimeError):
    """A Slurm command failed; the message holds the command and its error output."""


def slurm_command(
    argv: Sequence[str],
    *,
    check: bool = True,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> str:
    """Run a Slurm client command; its output. Raises :class:`SlurmError` when it fails."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=_COMMAND_TIMEOUT_S,
            check=False,
            input=stdin,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found; is Slurm installed on this machine?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)}: no answer in {_COMMAND_TIMEOUT_S:g} s") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{argv[0]} failed: {_last_error(argv[0], done.stderr, done.returncode)}")
    return done.stdout


def _last_error(program: str, stderr: str, returncode: int) -> str:
    """The line of a Slurm client's error output that says why (its last), unprefixed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return f"exit {returncode}"
    return re.sub(rf"^{re.escape(program)}: (?:fatal|error): ", "", lines[-1])


def allocation_cluster(
    environ: Mapping[str, str] | None = None, *, dtrain_network_interface: str | None = None
) -> Cluster:
    """The allocation this process runs in as a cluster: one agent per node.

    A node's slots are the GPUs Slurm gave the job there (their indices), else its CPUs
    in the allocation (one CPU slot per CPU, trials on gloo).

    It asks the allocation's Slurm controller (``scontrol``), so it runs only inside
    one; under ``salloc -N2`` on nodes ``node1`` and ``node2``::

        cluster = allocation_cluster()
        [agent.name for agent in cluster.pool("default").agents]  # ['node1', 'node2']
    """
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise ClusterConfigError(
            [
                "cluster slurm: not inside a Slurm allocation (SLURM_JOB_ID and "
                "SLURM_JOB_NODELIST are unset); run the search under salloc or sbatch"
            ]
        )
    try:
        names = slurm_command(["scontrol", "show", "hostnames", nodelist]).split()
        addresses = node_addresses(
            slurm_command(["scontrol", "-o", "show", "node", ",".join(names)])
        )
        gres = job_node_gres(slurm_command(["scontrol", "-d", "show", "job", job_id]))
        gres_of = {host: line for nodes, line in gres.items() for host in hostnames(nodes)}
    except SlurmError as exc:
        raise ClusterConfigError([f"cluster slurm: {exc}"]) from None
    cpus = expand_counts(env.get("SLURM_JOB_CPUS_PER_NODE", ""))
    agents = []
    any_gpus = False
    for i, name in enumerate(names):
        gpus = gpu_indices(gres_of.get(name, ""))
        any_gpus = any_gpus or bool(gpus)
        slots = gpus or tuple(range(cpus[i] if i < len(cpus) else 1))
        agents.append(Agent(name=name, host=addresses.get(name, name), slots=slots))
    return Cluster(
        pools=(ResourcePool(name=DEFAULT_POOL, agents=tuple(agents)),),
        executor="slurm",
        dtrain_network_interface=dtrain_network_interface,
        slurm_job_id=job_id,
        gpu_slots=any_gpus,
    )


def hostnames(nodelist: str) -> list[str]:
    """The node names of a Slurm node list (``n[1-3],m1``)."""
    if "[" not in nodelist and "," not in nodelist:
        return [nodelist]
    return slurm_command(["scontrol", "show", "hostnames", nodelist]).split()


def _job_nodes(job_id: str) -> set[str] | None:
    """The nodes job ``job_id`` holds now; None once Slurm has forgotten the job."""
    show = slurm_command(["scontrol", "-o", "show", "job", job_id], check=False)
    match = re.search(r"(?:^|\s)NodeList=(\S+)", show)
    if not match or match.group(1) == "(null)":
        return None
    return set(hostnames(match.group(1)))


def _steps_with_name(name: str) -> list[str]:
    """The ids of the steps called ``name`` that may still have processes.

    A step whose nodes all left its job's allocation (lost under ``--no-kill``) stays
    listed by Slurm 22.05 even after ``scancel``; its processes went with the node
    (slurmd ends a returning node's processes of jobs it no longer holds), so it is
    not counted.
    """
    live = []
    for step_id, nodelist in steps_named(
        slurm_command(["squeue", "-h", "-s", "-o", "%i %j %N"]), name
    ):
        held = _job_nodes(step_id.split(".")[0])
        if held is not None and nodelist and not held.intersection(hostnames(nodelist)):
            continue
        live.append(step_id)
    return live


@dataclass
class SlurmJob:
    """One attempt's ``srun`` client (the driver's child) and the job step it runs."""

    srun: subprocess.Popen[bytes]
    name: str
    agents: list[dict[str, Any]]
    step_id: str | None = None

    @property
    def external_id(self) -> str | None:
        return self.step_id

    def _wait_for_step_id(self) -> None:
        """Learn the step's id once Slurm lists it (the name finds it even without)."""
        deadline = time.monotonic() + _STEP_ID_WAIT_S
        while self.step_id is None and time.monotonic() < deadline and self.srun.poll() is None:
            found = _steps_with_name(self.name)
            if found:
                self.step_id = found[0]
            else:
                time.sleep(0.1)

    def poll(self) -> int | None:
        return self.srun.poll()

    def end(self, *, grace_s: float) -> bool:
        return _cancel_steps(self.name, grace_s=grace_s, srun=self.srun)

    def record(self, session: Session, run: TrialRun) -> None:
        self._wait_for_step_id()
        run.agents = self.agents
        run.external_id = self.step_id

    def waiting_reason(self) -> str | None:
        return None  # started as soon as launched

    def ending(self) -> JobEnding:
        return JobEnding()

    def describe(self) -> list[dict[str, Any]]:
        return self.agents


def _cancel_steps(
    name: str, *, grace_s: float, srun: subprocess.Popen[bytes] | None = None
) -> bool:
    """Cancel every step called ``name`` (SIGTERM, ``grace_s``, then kill); whether all are gone."""
    try:
        steps = _steps_with_name(name)
        if steps and grace_s > 0:
            slurm_command(["scancel", "--signal=TERM", *steps], check=False)
            deadline = time.monotonic() + grace_s
            while steps and time.monotonic() < deadline:
                time.sleep(0.2)
                steps = _steps_with_name(name)
        if steps:
            slurm_command(["scancel", *steps], check=False)
        deadline = time.monotonic() + _GONE_WAIT_S
        while steps and time.monotonic() < deadline:
            time.sleep(0.2)
            steps = _steps_with_name(name)
    except SlurmError:
        return False
    if srun is not None:
        try:
            srun.wait(timeout=_GONE_WAIT_S)
        except subprocess.TimeoutExpired:
            srun.kill()
            srun.wait()
    return not steps


class SlurmExecutor:
    """Starts each attempt as a job step of the allocation (``cluster.slurm_job_id``).

    Inside an allocation (``srun`` starts the job step, so no example runs it here)::

        executor = SlurmExecutor(allocation_cluster())
        job = executor.launch(request)
    """

    name = "slurm"
    remote = True
    places_trials = False
    # Each step's ``--gres`` binds whole GPUs: Slurm cannot put two steps on one.
    shares_slots = False

    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self._unavailable: dict[tuple[str, ...], tuple[float, frozenset[str]]] = {}

    def launch(self, request: LaunchRequest) -> SlurmJob:
        placement = request.placement
        if self.cluster is None or not self.cluster.slurm_job_id or placement is None:
            raise RuntimeError("the Slurm executor launches placed trials inside an allocation")
        nodes = [part.agent for part in placement.agents]
        per_node = {len(part.slots) for part in placement.agents}
        if len(per_node) != 1:
            raise RuntimeError(
                "a Slurm step runs the same number of slots on every node; "
                f"this placement has {sorted(per_node)}"
            )
        slots_per_node = per_node.pop()
        rdzv_host = nodes[0].host
        endpoint = f"{rdzv_host}:{rendezvous_port(request.rdzv_id)}" if len(nodes) > 1 else None
        torchrun = torchrun_args(
            nnodes=len(nodes),
            nproc_per_node=slots_per_node,
            rdzv_endpoint=endpoint,
            rdzv_id=request.rdzv_id,
        )
        name = step_name(request.token)
        use_gpus = bool(self.cluster.gpu_slots)
        argv = srun_argv(
            job_id=self.cluster.slurm_job_id,
            nodes=[node.name for node in nodes],
            slots_per_node=slots_per_node,
            use_gpus=use_gpus,
            name=name,
            torchrun=torchrun,
        )
        node_env = {
            SPEC_ENV_VAR: request.spec_json,
            NODE_SLOTS_ENV_VAR: json.dumps(
                {part.agent.name: list(part.slots) for part in placement.agents}
            ),
            RDZV_HOST_ENV_VAR: rdzv_host,
            RDZV_NODE_ENV_VAR: nodes[0].name,
        }
        if self.cluster.dtrain_network_interface:
            node_env[IFNAME_ENV_VAR] = self.cluster.dtrain_network_interface
        env = trial_environment(request.token, {**request.env, **node_env})
        request.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(request.log_path, "ab", buffering=0) as log:
            srun = subprocess.Popen(
                argv,
                cwd=request.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Ctrl-C in the driver's terminal must not reach srun (two Ctrl-C
                # cancel its step): the driver decides how trials stop.
                start_new_session=True,
            )
        agents = [
            {"agent": part.agent.name, "host": part.agent.host, "slots": list(part.slots)}
            for part in placement.agents
        ]
        return SlurmJob(srun=srun, name=name, agents=agents)

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        if not run.launch_token:
            return True
        gone = _cancel_steps(step_name(run.launch_token), grace_s=grace_s)
        if gone:
            mark_processes_ended(session, run)
        return gone

    def unavailable_agents(self, names: Sequence[str]) -> frozenset[str]:
        if not names:
            return frozenset()
        now = time.monotonic()
        key = tuple(names)
        cached = self._unavailable.get(key)
        # The driver asks every tick while trials wait; slurmctld need not answer as often.
        if cached is not None and now - cached[0] < _NODE_STATE_TTL_S:
            return cached[1]
        try:
            sinfo = slurm_command(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %t"])
            lost = set(unavailable_nodes(sinfo))
            if self.cluster is not None and self.cluster.slurm_job_id:
                # A node lost under ``--no-kill`` leaves the allocation for good, even
                # once it is back in service: no step of this job can use it again.
                lost |= set(names) - (_job_nodes(self.cluster.slurm_job_id) or set())
        except SlurmError:
            # Slurm does not answer: no node can be judged, none is excluded (the
            # step's own failure says more than a guess would).
            return frozenset()
        found = frozenset(lost)
        self._unavailable[key] = (now, found)
        return found

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        if run.ended_at is not None or not run.launch_token:
            return True
        try:
            gone = not _steps_with_name(step_name(run.launch_token))
        except SlurmError:
            return False
        if gone:
            mark_processes_ended(session, run)
        return gone
