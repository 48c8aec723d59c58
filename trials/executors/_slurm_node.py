"""One node's part of a Slurm job step: ``python -m trials.executors._slurm_node TORCHRUN_ARGS``.

``srun`` runs the same command on every node of the step; what differs per node comes
from Slurm's environment: the agent is ``SLURMD_NODENAME`` and its slots come from
``SLOTSWEEP_NODE_SLOTS`` (the placement's slots of every node, as JSON). The network
interface for NCCL and gloo is the cluster's ``dtrain_network_interface`` when set,
else the interface that holds this node's address for the rendezvous host, named in
the trial's log. Then ``torchrun`` runs in this process (:mod:`trials._torchrun`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from collections.abc import Sequence

NODE_SLOTS_ENV_VAR = "SLOTSWEEP_NODE_SLOTS"
IFNAME_ENV_VAR = "SLOTSWEEP_SOCKET_IFNAME"
RDZV_HOST_ENV_VAR = "SLOTSWEEP_RDZV_HOST"


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


def main(argv: Sequence[str] | None = None) -> int:
    """Set this node's agent, slots and network interface, then run ``torchrun``."""
    from trials._torchrun import main as torchrun_main
    from trials.launcher import AGENT_ENV_VAR, SLOTS_ENV_VAR

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    os.environ[AGENT_ENV_VAR] = node
    slots = json.loads(os.environ.get(NODE_SLOTS_ENV_VAR, "{}")).get(node)
    if slots is not None:
        os.environ[SLOTS_ENV_VAR] = ",".join(str(slot) for slot in slots)
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
    return torchrun_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
