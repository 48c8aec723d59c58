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
import sys
import zlib
from collections.abc import Sequence

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
    return [*argv, python, "-m", "trials.executors._slurm_node", *torchrun]


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
