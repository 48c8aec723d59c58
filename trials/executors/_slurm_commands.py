"""Pure helpers of the Slurm executor: command lines and the parsing of Slurm's output.

No I/O here, so every rule is tested in microseconds; :mod:`trials.executors._slurm`
runs the commands.

Example:
    >>> expand_counts("2(x3),4")
    [2, 2, 2, 4]
    >>> gpu_indices("gpu:2(IDX:0-1)")
    (0, 1)
"""

from __future__ import annotations

import re
import shlex
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trials.scheduler import SlurmJobSettings

#: Every step of an attempt is named after its launch token, so a later driver finds
#: the steps of a crashed one even when their ids never reached the database.
STEP_NAME_PREFIX = "slotsweep-"
# c10d's store listens on the first node; a port derived from the attempt's
# rendezvous id keeps concurrent trials on one node apart without asking that node.
_RDZV_PORT_BASE = 29500
_RDZV_PORT_SPAN = 10000


def step_name(token: str) -> str:
    """The Slurm name of an attempt's job step."""
    return f"{STEP_NAME_PREFIX}{token}"


def rendezvous_port(rdzv_id: str) -> int:
    """A port for the attempt's c10d store on its first node (stable for one attempt)."""
    return _RDZV_PORT_BASE + zlib.crc32(rdzv_id.encode()) % _RDZV_PORT_SPAN


def expand_counts(value: str) -> list[int]:
    """``SLURM_JOB_CPUS_PER_NODE`` (``"2(x3),4"``) as one count per node."""
    counts: list[int] = []
    for part in filter(None, value.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"not a Slurm count list: {value!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _index_ranges(text: str) -> tuple[int, ...]:
    indices: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return tuple(indices)


def gpu_indices(gres: str) -> tuple[int, ...]:
    """The GPU indices in a ``scontrol show job -d`` GRES entry (``gpu:a100:2(IDX:0-1)``)."""
    found: list[int] = []
    for match in re.finditer(r"gpu(?::[^:(,]+)*:?\d*\(IDX:([0-9,\-]+)\)", gres):
        found.extend(_index_ranges(match.group(1)))
    return tuple(sorted(set(found)))


def job_node_gres(detail: str) -> dict[str, str]:
    """Each node's GRES line in ``scontrol show job -d`` output (``Nodes=a CPU_IDs=... GRES=...``)."""
    by_node: dict[str, str] = {}
    for line in detail.splitlines():
        match = re.search(r"\bNodes=(\S+).*?\bGRES=(\S*)", line)
        if match:
            by_node[match.group(1)] = match.group(2)
    return by_node


def node_addresses(show_node: str) -> dict[str, str]:
    """NodeName -> NodeAddr from ``scontrol -o show node`` (one node per line)."""
    found: dict[str, str] = {}
    for line in show_node.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        addr = re.search(r"\bNodeAddr=(\S+)", line)
        if name:
            found[name.group(1)] = addr.group(1) if addr else name.group(1)
    return found


def steps_named(squeue_steps: str, name: str) -> list[tuple[str, str]]:
    """(step id ``JOB.STEP``, node list) of each step called ``name``.

    Parses ``squeue -h -s -o "%i %j %N"`` output.
    """
    found = []
    for line in squeue_steps.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == name:
            found.append((parts[0], parts[2] if len(parts) > 2 else ""))
    return found


def srun_argv(
    *,
    job_id: str,
    nodes: Sequence[str],
    slots_per_node: int,
    use_gpus: bool,
    name: str,
    torchrun: Sequence[str],
    python: str = sys.executable,
) -> list[str]:
    """The ``srun`` command that runs one attempt as one job step of allocation ``job_id``.

    One task per node (each runs the node's ``torchrun``), on exactly the placement's
    nodes; ``--exact`` keeps concurrent steps on distinct CPUs and GPUs of a node, and
    ``--kill-on-bad-exit`` ends the whole step when one node's ``torchrun`` fails
    (the gang would wait for it forever otherwise).

    Example:
        >>> srun_argv(job_id="7", nodes=["n1", "n2"], slots_per_node=2, use_gpus=False,
        ...           name="slotsweep-x", torchrun=["tr"], python="py")[:6]
        ['srun', '--jobid=7', '--nodes=2', '--ntasks=2', '--ntasks-per-node=1', '--nodelist=n1,n2']
    """
    argv = [
        "srun",
        f"--jobid={job_id}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--exact",
        "--kill-on-bad-exit=1",
        f"--job-name={name}",
        "--export=ALL",
        # The step's output comes back through srun to the trial's log, line by line.
        "--unbuffered",
    ]
    if use_gpus:
        argv += [f"--gpus-per-node={slots_per_node}", f"--cpus-per-task={slots_per_node}"]
    else:
        argv.append(f"--cpus-per-task={slots_per_node}")
    return [*argv, python, "-m", "trials.node.cluster_node", *torchrun]


# sinfo's short states in which a node takes no new job step.
_UNAVAILABLE_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "futr", "unk")


def unavailable_nodes(sinfo: str) -> frozenset[str]:
    """Nodes that cannot run a step, from ``sinfo -h -N -o "%N %t"``.

    A trailing ``*`` means slurmctld gets no answer from the node (it is lost even
    before Slurm marks it down).

    Example:
        >>> sorted(unavailable_nodes(chr(10).join(["n1 idle", "n2 down*", "n3 alloc*", "n4 drain"])))
        ['n2', 'n3', 'n4']
    """
    found = set()
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        name, state = parts
        if state.endswith("*") or state.rstrip("~#!%$@^-").startswith(_UNAVAILABLE_STATES):
            found.add(name)
    return frozenset(found)


# --------------------------------------------------------------------- one job per trial


@dataclass(frozen=True)
class PartitionNode:
    """A node of a partition as ``sinfo`` lists it."""

    name: str
    address: str
    cpus: int
    gpus: int
    features: frozenset[str]


#: ``sinfo -h -N -p PARTITION -o`` this format is what :func:`partition_nodes` reads.
SINFO_NODE_FORMAT = "%N|%o|%c|%G|%f"


def gpu_count(gres: str) -> int:
    """How many GPUs a node's ``sinfo %G`` entry names (``gpu:a100:4(S:0-1),gpu:2``)."""
    total = 0
    for entry in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", entry).split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def partition_nodes(sinfo: str) -> list[PartitionNode]:
    """The nodes in ``sinfo -h -N -p P -o "%N|%o|%c|%G|%f"`` output, each once, in order.

    Example:
        >>> [(n.name, n.cpus, n.gpus) for n in partition_nodes("n1|10.0.0.1|64|gpu:a100:4|a100")]
        [('n1', 64, 4)]
    """
    nodes: dict[str, PartitionNode] = {}
    for line in sinfo.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[2].isdigit() or parts[0] in nodes:
            continue
        name, address, cpus, gres, features = parts
        nodes[name] = PartitionNode(
            name=name,
            address=address if address and address != "(null)" else name,
            cpus=int(cpus),
            gpus=gpu_count(gres),
            features=frozenset(f for f in features.split(",") if f and f != "(null)"),
        )
    return list(nodes.values())


def nodes_meeting(nodes: Sequence[PartitionNode], constraint: str | None) -> list[PartitionNode]:
    """The nodes a ``--constraint`` allows, for the simple forms ``a`` and ``a&b``.

    Other expressions (``|``, counts, brackets) are left to Slurm: every node counts.

    Example:
        >>> nodes = [PartitionNode("n1", "n1", 8, 2, frozenset({"a100"})),
        ...          PartitionNode("n2", "n2", 8, 2, frozenset())]
        >>> [n.name for n in nodes_meeting(nodes, "a100")]
        ['n1']
    """
    if not constraint or not re.fullmatch(r"[\w.\-]+(?:&[\w.\-]+)*", constraint):
        return list(nodes)
    wanted = set(constraint.split("&"))
    return [node for node in nodes if wanted <= node.features]


def sbatch_argv(
    settings: SlurmJobSettings,
    *,
    nodes: int,
    slots_per_node: int,
    use_gpus: bool,
    name: str,
    log_path: str,
) -> list[str]:
    """The ``sbatch`` command that submits one attempt of a trial (the script on stdin).

    A trial on several nodes takes them whole (``--exclusive``, as the scheduler's
    multi-agent rule does); on one node it asks for its GPUs (or CPUs) only. The job
    is never requeued by Slurm: a preempted or timed-out attempt is resubmitted by the
    driver as the trial's next attempt, from its latest checkpoint.

    The cluster file's ``sbatch_options`` come first and slotsweep's own options after
    them, so where sbatch takes the last of a repeated option, ours win; the cluster
    file refuses every spelling of the options written here (``MANAGED_SBATCH_OPTIONS``
    in :mod:`trials.scheduler._sbatch_options`), words sbatch would take as a script,
    and an option left waiting for a value it would take from ours. No script argument
    follows: the script comes on stdin.

    Example:
        >>> from trials.scheduler import SlurmJobSettings
        >>> sbatch_argv(SlurmJobSettings("gpu", "60", sbatch_options=("--mem=64G",)),
        ...             nodes=2, slots_per_node=4, use_gpus=True, name="slotsweep-x",
        ...             log_path="t.log")[:3]
        ['sbatch', '--mem=64G', '--parsable']
    """
    argv = [
        "sbatch",
        *settings.sbatch_options,
        "--parsable",
        f"--partition={settings.partition}",
        f"--time={settings.time_limit}",
        f"--job-name={name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
    ]
    if nodes > 1:
        argv.append("--exclusive")
    if use_gpus:
        argv.append(f"--gpus-per-node={slots_per_node}")
    # One task per node runs torchrun and its ranks: a CPU per rank at least.
    argv.append(f"--cpus-per-task={slots_per_node}")
    for option, value in (
        ("--account", settings.account),
        ("--qos", settings.qos),
        ("--constraint", settings.constraint),
    ):
        if value:
            argv.append(f"{option}={value}")
    return [
        *argv,
        f"--output={log_path}",
        "--open-mode=append",
        "--no-requeue",
        "--export=ALL",
    ]


def batch_script(torchrun: Sequence[str], python: str = sys.executable) -> str:
    """The job's script: one ``srun`` step of the node wrapper on every node of the job.

    ``exec`` leaves srun as the batch step's process, so a SIGTERM from Slurm
    (preemption, time limit, ``scancel``) reaches the trial's processes, which
    checkpoint, instead of ending a shell that would end the job at once.
    """
    step = [
        "srun",
        "--unbuffered",
        "--kill-on-bad-exit=1",
        "--ntasks-per-node=1",
        python,
        "-m",
        "trials.node.cluster_node",
        *torchrun,
    ]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in step) + "\n"


@dataclass(frozen=True)
class JobStatus:
    """A Slurm job's state as ``squeue``/``scontrol`` report it."""

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: int | None = None

    @property
    def pending(self) -> bool:
        """Queued in Slurm, no process started yet."""
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD")

    @property
    def stopped_by_cluster(self) -> bool:
        """Slurm ended it on its own account (preemption, time limit), not the trial."""
        return self.state in ("PREEMPTED", "TIMEOUT", "DEADLINE")


def squeue_jobs(squeue: str) -> dict[str, JobStatus]:
    """Jobs in ``squeue -h -j IDS -o "%i|%T|%r|%N"`` output (the jobs still listed)."""
    found = {}
    for line in squeue.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            job_id, state, reason, nodes = parts
            found[job_id] = JobStatus(job_id, state, "" if reason == "None" else reason, nodes)
    return found


def show_job(text: str) -> JobStatus | None:
    """An ended job from ``scontrol -o show job ID``; its exit code as a shell reports it.

    Example:
        >>> show_job("JobId=7 JobName=x JobState=CANCELLED Reason=None NodeList=n1 "
        ...           "ExitCode=0:15").exit_code
        143
    """
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobId" not in fields or "JobState" not in fields:
        return None
    exit_code = _exit_code(fields.get("ExitCode", ""))
    return JobStatus(
        job_id=fields["JobId"],
        state=fields["JobState"],
        reason="" if fields.get("Reason") in (None, "None") else fields["Reason"],
        nodes="" if fields.get("NodeList") == "(null)" else fields.get("NodeList", ""),
        exit_code=exit_code,
    )


def _exit_code(value: str) -> int | None:
    """Slurm's ``CODE:SIGNAL`` as a shell reports it (128 + signal when killed)."""
    code, _, signal = value.partition(":")
    if not code.isdigit():
        return None
    return 128 + int(signal) if signal.isdigit() and int(signal) else int(code)


def sacct_job(job_id: str, sacct: str) -> JobStatus | None:
    """The job in ``sacct -n -X -P -o JobID,State,ExitCode,NodeList`` output, if listed.

    Example:
        >>> sacct_job("7", "7|CANCELLED by 0|0:15|n1").state
        'CANCELLED'
    """
    for line in sacct.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            return JobStatus(
                job_id=job_id,
                state=parts[1].split()[0] if parts[1] else "UNKNOWN",
                nodes="" if parts[3] in ("", "None assigned") else parts[3],
                exit_code=_exit_code(parts[2]),
            )
    return None
