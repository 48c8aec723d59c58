"""One node's part of a Ray attempt: the actor that runs that node's ``torchrun``.

The Ray executor starts one :class:`NodeRunner` per node of a placement, each in the
placement group's bundle pinned to its node, so the process it starts runs on that
node with the bundle's resources (Ray sets ``CUDA_VISIBLE_DEVICES`` to the bundle's
GPUs). ``torchrun`` runs under the same node wrapper as on Slurm
(:mod:`trials.node.cluster_node`: this node's slots, whether it hosts the c10d
store, the network interface), with ``--local-addr`` set to the node's Ray address,
since the peers may not resolve its host name. Its output is kept here, line by line,
until the driver collects it (:meth:`NodeRunner.drain`); the driver writes it into the
trial's log, where the ranks' own ``[rank N]`` prefixes tell them apart.

``torchrun`` leads a session of its own and gets SIGKILL when the thread that started
it ends (``PR_SET_PDEATHSIG``): that thread lives until ``torchrun`` exits, so a killed
actor (its driver's Ray job ended, ``ray.kill``, a lost raylet) takes ``torchrun`` with
it, and the ranks die with their ``torchrun``. No ``ray`` import here: the executor
wraps the class with ``ray.remote``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

# prctl(2)
_PR_SET_PDEATHSIG = 1
# Lines kept between two collections; a driver that stops collecting loses the oldest.
_MAX_LINES = 100_000


def _die_with_parent_thread() -> None:
    """In the child, before exec: SIGKILL when the thread that started it ends."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class NodeRunner:
    """Runs one node's ``torchrun`` of an attempt and keeps its output for the driver."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=_MAX_LINES)
        self._process: subprocess.Popen[bytes] | None = None
        self._exit_code: int | None = None
        self._started = threading.Event()
        self._start_error: str | None = None

    def start(
        self,
        torchrun: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        agent: str,
        slots: Sequence[int],
        gpu_slots: bool,
    ) -> dict[str, Any]:
        """Start ``torchrun`` (its arguments) on this node; where it runs (host, pid, slots...).

        ``slots`` are the placement's slots of this node; with GPU slots the bundle's
        GPUs (what Ray put in ``CUDA_VISIBLE_DEVICES``) are the slots the ranks record.
        """
        import ray  # the actor runs in a Ray worker: ray is there

        from trials.launch.launcher import AGENT_ENV_VAR, trial_environment
        from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR
        from trials.node.cluster_node import NODE_SLOTS_ENV_VAR

        full = trial_environment(env.get(LAUNCH_TOKEN_ENV_VAR, ""), env)
        address = ray.util.get_node_ip_address()
        full[AGENT_ENV_VAR] = agent
        # torchrun's --local-addr: the peers reach this node by address, not by a host
        # name they may not resolve.
        full["PET_LOCAL_ADDR"] = address
        given = list(slots)
        if gpu_slots:
            given = [int(gpu) for gpu in ray.get_gpu_ids()]
            full["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        full[NODE_SLOTS_ENV_VAR] = json.dumps({agent: given})
        argv = [sys.executable, "-m", "trials.node.cluster_node", *torchrun]
        thread = threading.Thread(
            target=self._run, args=(argv, full, cwd), name="torchrun", daemon=True
        )
        thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise RuntimeError(self._start_error)
        assert self._process is not None
        import psutil

        try:
            create_time = psutil.Process(self._process.pid).create_time()
        except psutil.Error:
            create_time = None  # exited at once: its exit code tells the rest
        return {
            "host": address,
            "pid": self._process.pid,
            "create_time": create_time,
            "slots": given,
        }

    def _run(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        """Start ``torchrun`` from this thread, then read its output until it exits."""
        try:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent_thread,
            )
        except OSError as exc:
            self._start_error = f"torchrun did not start: {exc}"
            self._started.set()
            return
        self._process = process
        self._started.set()
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self._lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
        self._exit_code = process.wait()

    def drain(self) -> tuple[list[str], int | None]:
        """The output lines since the last call, and the exit code once ``torchrun`` ended.

        The exit code comes only after every line: the reader sets it at end of output.
        """
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        return lines, self._exit_code

    def terminate(self, grace_s: float) -> bool:
        """SIGTERM ``torchrun``'s session, ``grace_s``, then SIGKILL it; whether it is gone."""
        process = self._process
        if process is None or process.poll() is not None:
            return True
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if sig == signal.SIGTERM and grace_s <= 0:
                continue
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    return True
                time.sleep(0.05)
        return process.poll() is not None


class ClusterProbe:
    """The driver's eyes inside the Ray cluster: what each node has free, and for whom.

    Per-node free resources are not served to a Ray Client driver, so one small actor
    (no CPU, on the head node) answers for it. Slots held by slotsweep's own placement
    groups (named with ``prefix``) are the database ledger's business; anything else
    using a node's slots is some other Ray user's.
    """

    def node_usage(self, prefix: str, resource: str) -> dict[str, tuple[bool, float]]:
        """Node address -> (alive, how much of ``resource`` others than slotsweep use)."""
        import ray
        from ray._private import state

        available = state.available_resources_per_node()
        ours: dict[str, float] = {}
        for group in ray.util.placement_group_table().values():
            if not str(group.get("name", "")).startswith(prefix) or group["state"] != "CREATED":
                continue
            for index, node_id in group["bundles_to_node_id"].items():
                amount = group["bundles"][index].get(resource, 0.0)
                ours[node_id] = ours.get(node_id, 0.0) + amount
        usage = {}
        for node in ray.nodes():
            node_id = node["NodeID"]
            total = node["Resources"].get(resource, 0.0)
            free = available.get(node_id, {}).get(resource, 0.0)
            foreign = max(0.0, total - free - ours.get(node_id, 0.0))
            if node["Alive"] or node["NodeManagerAddress"] not in usage:
                usage[node["NodeManagerAddress"]] = (bool(node["Alive"]), foreign)
        return usage

    def end_attempt(self, prefix: str, namespace: str, grace_s: float) -> list[str]:
        """End the actors named ``prefix*`` (``torchrun`` first, ``grace_s``) and their group.

        Done here, inside the cluster: a Ray Client driver cannot call methods on the
        handle of an actor another driver created. Returns the names still alive.
        """
        import contextlib

        import ray

        def named() -> list[str]:
            return [
                entry["name"]
                for entry in ray.util.list_named_actors(all_namespaces=True)
                if entry["namespace"] == namespace and entry["name"].startswith(prefix)
            ]

        handles: list[Any] = []
        for name in named():
            with contextlib.suppress(ValueError):  # ended meanwhile
                handles.append(ray.get_actor(name, namespace=namespace))
        endings: list[Any] = [handle.terminate.remote(grace_s) for handle in handles]
        for ending in endings:
            with contextlib.suppress(Exception):  # a dead actor took its torchrun with it
                ray.get(ending, timeout=grace_s + 15)
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        group = prefix.rstrip("-")
        with contextlib.suppress(Exception):  # no such group (left already)
            ray.util.remove_placement_group(ray.util.get_placement_group(group))
        deadline = time.monotonic() + 15
        left = named()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = named()
        return left
