"""A port taken before an attempt binds it fails that attempt at once, and says so.

Which node hosts the c10d rendezvous store is said to torchrun, on every executor
(its own guess waits a minute on a taken port); torchrun's failure to bind is found in
its error and recorded; a rank still joining its group dies at once on SIGTERM. The
driver's side (a port clash starts the trial again, no restart counted) is in
``tests/searcher/driver/test_failures.py``, ``tests/searcher/driver/test_driver_parts.py`` and, with
real searches whose port is taken, ``tests/searcher/test_port_clash.py``.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from torch.distributed import DistNetworkError
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

import trials.node.torchrun
from trials.launch.launcher import RDZV_CONF_ENV_VAR, torchrun_commands
from trials.node import cluster_node
from trials.node.torchrun import port_taken
from trials.runtime._signals import install_checkpoint_on_sigterm, sigterm_ends_at_once
from trials.scheduler import Agent, AgentSlots, Placement

_TAKEN = (
    "The server socket has failed to listen on any local network address. port: 29512, "
    "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
)


def _placement(*agents: str) -> Placement:
    parts = tuple(AgentSlots(Agent(name, "127.0.0.1", (0, 1)), (0, 1)) for name in agents)
    return Placement(request_id=1, pool="default", agents=parts)


def test_the_first_agent_hosts_the_rendezvous_store_and_the_others_join_it() -> None:
    commands = torchrun_commands(_placement("a", "b", "c"), rdzv_id="t", rdzv_port=29512)
    assert [c.env[RDZV_CONF_ENV_VAR] for c in commands] == ["is_host=1", "is_host=0", "is_host=0"]
    assert all("--rdzv-endpoint=127.0.0.1:29512" in c.argv for c in commands)
    # One agent: --standalone, its store on a port torchrun binds itself.
    (alone,) = torchrun_commands(_placement("a"), rdzv_id="t")
    assert RDZV_CONF_ENV_VAR not in alone.env and "--standalone" in alone.argv


_NODE_ENV = (
    "SLURMD_NODENAME",
    cluster_node.RDZV_NODE_ENV_VAR,
    cluster_node.RDZV_HOST_ENV_VAR,
    cluster_node.RDZV_PORT_ENV_VAR,
    cluster_node.NODE_SLOTS_ENV_VAR,
    cluster_node.IFNAME_ENV_VAR,
    "PET_RDZV_ENDPOINT",
    RDZV_CONF_ENV_VAR,
    "SLOTSWEEP_AGENT",
    "SLOTSWEEP_SLOTS",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "SLOTSWEEP_CHECKPOINT_ON_SIGTERM",
)


def _node_wrapper_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    """Run the Slurm node wrapper with ``env`` (nothing else of it set); torchrun's environment."""
    for name in _NODE_ENV:  # restored after the test, whatever the wrapper sets
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen: dict[str, Any] = {}

    def torchrun(args: list[str]) -> int:
        seen.update(os.environ)
        return 0

    monkeypatch.setattr(trials.node.torchrun, "main", torchrun)
    monkeypatch.setattr(cluster_node, "_first_node", lambda: ("ssnode1", "10.9.0.11"))
    monkeypatch.setattr(cluster_node, "_interface_towards", lambda host: None)
    assert cluster_node.main(["--nnodes=2", "-m", "trials.node.worker"]) == 0
    return seen


@pytest.mark.parametrize("node", ["ssnode1", "ssnode2"])
def test_on_slurm_the_first_node_of_the_step_or_job_hosts_the_store(
    monkeypatch: pytest.MonkeyPatch, node: str
) -> None:
    hosts = "1" if node == "ssnode1" else "0"
    # A step of an allocation: the driver names the first node of the placement.
    step = _node_wrapper_env(
        monkeypatch,
        SLURMD_NODENAME=node,
        SLOTSWEEP_RDZV_NODE="ssnode1",
        SLOTSWEEP_RDZV_HOST="10.9.0.11",
    )
    assert step[RDZV_CONF_ENV_VAR] == f"is_host={hosts}"
    # A job Slurm placed: its first node, known only on the nodes.
    job = _node_wrapper_env(monkeypatch, SLURMD_NODENAME=node, SLOTSWEEP_RDZV_PORT="29512")
    assert job["PET_RDZV_ENDPOINT"] == "10.9.0.11:29512"
    assert job[RDZV_CONF_ENV_VAR] == f"is_host={hosts}"


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as caught:
        return caught


def test_torchruns_own_bind_error_is_found_a_failed_ranks_is_not() -> None:
    bind = DistNetworkError(_TAKEN)
    wrapped = _raised_from(RendezvousConnectionError("The connection ... has failed."), bind)
    assert port_taken(wrapped) is bind
    assert port_taken(RendezvousConnectionError("timed out")) is None
    # A rank that failed so recorded it itself; torchrun's summary quotes it.
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file="/nonexistent")
    child = ChildFailedError("trials.node.worker", {0: failure})
    assert port_taken(_raised_from(child, DistNetworkError(_TAKEN))) is None


def test_a_rank_joining_its_group_dies_on_sigterm_unless_sigterm_means_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, handler)
    with sigterm_ends_at_once():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is handler
    monkeypatch.setenv("SLOTSWEEP_CHECKPOINT_ON_SIGTERM", "1")
    assert install_checkpoint_on_sigterm()
    checkpoint = signal.getsignal(signal.SIGTERM)
    with sigterm_ends_at_once():
        assert signal.getsignal(signal.SIGTERM) is checkpoint
