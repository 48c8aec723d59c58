"""One node's part of a multi-node attempt: ``python -m trials.node.cluster_node TORCHRUN_ARGS``.

The Ray executor's node actors run it too (:mod:`trials.node.ray_actors`), naming
the agent in ``SLOTSWEEP_AGENT``. ``srun`` runs the same command on every node of the
step; what differs per node comes
from Slurm's environment: the agent is ``SLURMD_NODENAME`` and its slots come from
``SLOTSWEEP_NODE_SLOTS`` (the placement's slots of every node, as JSON), or, in a job
that Slurm placed, from the GPUs Slurm gave the step (else CPU slots 0..n-1). There
the rendezvous host is the job's first node, known only now: with
``SLOTSWEEP_RDZV_PORT`` set the wrapper looks it up and hands torchrun
``PET_RDZV_ENDPOINT``. The first node's torchrun hosts the c10d store, the others join
it (``is_host`` in ``PET_RDZV_CONF``, from ``SLOTSWEEP_RDZV_NODE`` or that look-up):
torchrun's own guess would wait a minute on a taken port instead of failing. With
``SLOTSWEEP_CHECKPOINT_ON_SIGTERM=1`` torchrun ignores SIGTERM (its ranks checkpoint
on it and then exit, which ends torchrun). The network interface for NCCL and gloo is
the cluster's ``dtrain_network_interface`` when set, else the interface that holds this
node's address for the rendezvous host, named in the trial's log. Then ``torchrun`` runs in this process (:mod:`trials.node.torchrun`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Sequence

NODE_SLOTS_ENV_VAR = "SLOTSWEEP_NODE_SLOTS"
IFNAME_ENV_VAR = "SLOTSWEEP_SOCKET_IFNAME"
RDZV_HOST_ENV_VAR = "SLOTSWEEP_RDZV_HOST"
RDZV_PORT_ENV_VAR = "SLOTSWEEP_RDZV_PORT"
#: The Slurm name of the node whose torchrun hosts the rendezvous store.
RDZV_NODE_ENV_VAR = "SLOTSWEEP_RDZV_NODE"


def _interface_towards(host: str) -> str | None:
    """The interface whose IPv4 network holds ``host``'s address (how this node reaches it)."""
    import psutil

    try:
        target = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return None
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family != socket.AF_INET or not address.netmask:
                continue
            network = ipaddress.ip_network(f"{address.address}/{address.netmask}", strict=False)
            if target in network and not target.is_loopback:
                return name
    return None


def _first_node() -> tuple[str, str]:
    """The job's first node, where c10d's store listens: its name and address (``NodeAddr``)."""
    import subprocess

    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")

    def scontrol(*args: str) -> str:
        return subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    first = scontrol("show", "hostnames", nodelist).split()[0]
    found = re.search(r"\bNodeAddr=(\S+)", scontrol("-o", "show", "node", first))
    return first, found.group(1) if found else first


def _slots_given(args: Sequence[str]) -> list[int]:
    """This node's slots in a job Slurm placed: the GPUs it gave the step, else CPU slots."""
    gpus = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    if gpus:
        return [int(gpu) for gpu in gpus.split(",") if gpu.strip().isdigit()]
    from trials.launch.launcher import ranks_per_node

    return list(range(ranks_per_node(args)))


def main(argv: Sequence[str] | None = None) -> int:
    """Set this node's agent, slots and network interface, then run ``torchrun``."""
    from trials.launch.launcher import (
        AGENT_ENV_VAR,
        CHECKPOINT_ON_SIGTERM_ENV_VAR,
        RDZV_CONF_ENV_VAR,
        SLOTS_ENV_VAR,
        rendezvous_conf,
    )
    from trials.node.torchrun import main as torchrun_main

    args = list(sys.argv[1:] if argv is None else argv)
    # A Ray actor names its agent (a Ray node's name need not be its host name).
    node = (
        os.environ.get("SLURMD_NODENAME") or os.environ.get(AGENT_ENV_VAR) or socket.gethostname()
    )
    os.environ[AGENT_ENV_VAR] = node
    slots = json.loads(os.environ.get(NODE_SLOTS_ENV_VAR, "{}")).get(node)
    if slots is None and os.environ.get(RDZV_PORT_ENV_VAR):
        slots = _slots_given(args)
    if slots is not None:
        os.environ[SLOTS_ENV_VAR] = ",".join(str(slot) for slot in slots)
    if os.environ.get(RDZV_PORT_ENV_VAR) and not os.environ.get(RDZV_HOST_ENV_VAR):
        first, host = _first_node()
        os.environ[RDZV_NODE_ENV_VAR] = first
        os.environ[RDZV_HOST_ENV_VAR] = host
        os.environ["PET_RDZV_ENDPOINT"] = f"{host}:{os.environ[RDZV_PORT_ENV_VAR]}"
    if os.environ.get(RDZV_NODE_ENV_VAR):
        hosts_store = node == os.environ[RDZV_NODE_ENV_VAR]
        os.environ[RDZV_CONF_ENV_VAR] = rendezvous_conf(hosts_store=hosts_store)
    if os.environ.get(CHECKPOINT_ON_SIGTERM_ENV_VAR) == "1":
        # torchrun would answer SIGTERM by killing the ranks; they checkpoint instead,
        # and torchrun ends when they have.
        os.environ["PET_SIGNALS_TO_HANDLE"] = "SIGINT,SIGHUP,SIGQUIT"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ifname = os.environ.get(IFNAME_ENV_VAR)
    chosen = "the cluster's dtrain_network_interface"
    if not ifname and os.environ.get(RDZV_HOST_ENV_VAR):
        ifname = _interface_towards(os.environ[RDZV_HOST_ENV_VAR])
        chosen = f"the interface towards the rendezvous host {os.environ[RDZV_HOST_ENV_VAR]}"
    if ifname:
        os.environ["NCCL_SOCKET_IFNAME"] = ifname
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
        print(
            f"[slotsweep] {node}: NCCL and gloo use network interface {ifname} ({chosen})",
            flush=True,
        )
    return torchrun_main(args)


if __name__ == "__main__":
    # As the single-node wrapper ends (trials.node.torchrun): no teardown of torch.
    from trials.node.exiting import exit_without_teardown

    exit_without_teardown(main())
