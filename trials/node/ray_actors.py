"""A Ray node's part of slotsweep's attempts: the actor that runs that node's ``torchrun``.

The Ray executor keeps one :class:`NodeRunner` per node for its driver's whole run (no
CPU or GPU of its own, pinned to its node), and each attempt's placement group reserves
the attempt's slots there: once Ray has reserved them, the runner starts the attempt's
``torchrun`` on that node. Starting an actor per attempt instead cost a Ray worker
process and its imports, about a second, before every trial; a runner is an idle
thread pool between attempts. With GPU slots the executor tells the runner which GPUs
Ray reserved for the bundle (``CUDA_VISIBLE_DEVICES``). ``torchrun`` runs under the
same node wrapper as on Slurm (:mod:`trials.node.cluster_node`: this node's slots,
whether it hosts the c10d store, the network interface), with ``--local-addr`` set to
the node's Ray address, since the peers may not resolve its host name. Its output is
kept here, line by line and per attempt (named by its launch token), until the driver
collects it (:meth:`NodeRunner.drain`); the driver writes it into the trial's log, where
the ranks' own ``[rank N]`` prefixes tell them apart.

``torchrun`` leads a session of its own and gets SIGKILL when the thread that started
it ends (``PR_SET_PDEATHSIG``): that thread lives until ``torchrun`` exits, so a killed
runner (its driver's Ray job ended, ``ray.kill``, a lost raylet) takes every
``torchrun`` it started with it, and the ranks die with their ``torchrun``. No ``ray``
import at module level: the executor wraps the class with ``ray.remote``.
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


def bundle_gpus() -> list[int]:
    """The GPUs Ray gave this task: run holding all of a bundle's GPUs, that bundle's."""
    import ray

    return [int(gpu) for gpu in ray.get_gpu_ids()]


class _Attempt:
    """One attempt's ``torchrun`` on this node: its process, output so far and exit code."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=_MAX_LINES)
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.started = threading.Event()
        self.start_error: str | None = None

    def run(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
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
            self.start_error = f"torchrun did not start: {exc}"
            self.started.set()
            return
        self.process = process
        self.started.set()
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
        self.exit_code = process.wait()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self, grace_s: float) -> bool:
        """SIGTERM ``torchrun``'s session, ``grace_s``, then SIGKILL it; whether it is gone."""
        process = self.process
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


class NodeRunner:
    """Runs the ``torchrun`` of each attempt its driver places on this node; keeps their output."""

    def __init__(self) -> None:
        self._attempts: dict[str, _Attempt] = {}
        # Attempts given up before their start arrived (calls may overtake each other).
        self._released: set[str] = set()
        self._lock = threading.Lock()

    def start(
        self,
        token: str,
        torchrun: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        agent: str,
        slots: Sequence[int],
        gpus: Sequence[int] | None,
    ) -> dict[str, Any]:
        """Start attempt ``token``'s ``torchrun`` (its arguments) here; where it runs (host, pid...).

        ``slots`` are the placement's slots of this node; with GPU slots, ``gpus`` are
        the GPUs Ray reserved for the attempt's bundle here, the slots the ranks record.
        """
        import ray  # the actor runs in a Ray worker: ray is there

        from trials.launch.launcher import AGENT_ENV_VAR, trial_environment
        from trials.node.cluster_node import NODE_SLOTS_ENV_VAR

        # Ray gives its worker OMP_NUM_THREADS = the actor's CPUs (at least 1) where the
        # node's own environment sets none (one process to use them all); torchrun's
        # ranks are one process per slot and take the launcher's default instead, as
        # on every other executor. (A node's own setting of that number is lost too.)
        ray_cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        if os.environ.get("OMP_NUM_THREADS") == str(max(int(ray_cpus or 1), 1)):
            del os.environ["OMP_NUM_THREADS"]
        full = trial_environment(token, env)
        address = ray.util.get_node_ip_address()
        full[AGENT_ENV_VAR] = agent
        # torchrun's --local-addr: the peers reach this node by address, not by a host
        # name they may not resolve.
        full["PET_LOCAL_ADDR"] = address
        given = list(slots)
        if gpus is not None:
            given = [int(gpu) for gpu in gpus]
            full["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in given)
            full["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        full[NODE_SLOTS_ENV_VAR] = json.dumps({agent: given})
        argv = [sys.executable, "-m", "trials.node.cluster_node", *torchrun]
        attempt = _Attempt()
        with self._lock:
            if token in self._released or token in self._attempts:
                raise RuntimeError(f"attempt {token} was given up before its torchrun started")
            self._attempts[token] = attempt
        thread = threading.Thread(
            target=attempt.run, args=(argv, full, cwd), name=f"torchrun-{token}", daemon=True
        )
        thread.start()
        attempt.started.wait()
        if attempt.start_error is not None:
            raise RuntimeError(attempt.start_error)
        assert attempt.process is not None
        import psutil

        from trials.launch.processes import start_time

        try:
            # Not psutil's create_time (whole-second boot time: up to a second early,
            # before the end of the attempt this one replaces).
            create_time = start_time(psutil.Process(attempt.process.pid))
        except psutil.Error:
            create_time = None  # exited at once: its exit code tells the rest
        return {
            "host": address,
            "pid": attempt.process.pid,
            "create_time": create_time,
            "slots": given,
        }

    def drain(self, token: str) -> tuple[list[str], int | None]:
        """Attempt ``token``'s output lines since the last call, and its exit code once ended.

        The exit code comes only after every line: the reader sets it at end of output.
        """
        attempt = self._attempts.get(token)
        if attempt is None:
            return [], None
        lines = []
        while attempt.lines:
            lines.append(attempt.lines.popleft())
        return lines, attempt.exit_code

    def terminate(self, token: str, grace_s: float) -> bool:
        """End attempt ``token``'s ``torchrun`` (SIGTERM, ``grace_s``, SIGKILL); whether it is gone."""
        attempt = self._attempts.get(token)
        return attempt is None or attempt.terminate(grace_s)

    def release(self, token: str) -> int:
        """Forget attempt ``token`` (ending its ``torchrun`` if it runs); how many others run here."""
        with self._lock:
            self._released.add(token)
            attempt = self._attempts.pop(token, None)
        if attempt is not None and attempt.terminate(0.0):
            from trials.launch.processes import remove_torchrun_log_dirs

            # A torchrun that was SIGKILLed left its log folder behind.
            remove_torchrun_log_dirs(token)
        return sum(1 for other in list(self._attempts.values()) if other.running())

    def holds(self, token: str, *, running: bool) -> bool:
        """Whether attempt ``token`` started here and is not released (``running``: and runs)."""
        attempt = self._attempts.get(token)
        return attempt is not None and (attempt.running() or not running)


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

    def holders(self, token: str, prefix: str, namespace: str) -> list[str]:
        """The runners (actors named ``prefix*``, any driver's) where attempt ``token`` runs.

        Asked here, inside the cluster: a Ray Client driver cannot call methods on the
        handle of an actor another driver created.
        """
        return [name for name, _ in self._holding(token, prefix, namespace, running=True)]

    def end_attempt(
        self, token: str, group: str, prefix: str, namespace: str, grace_s: float, *, keep: str
    ) -> list[str]:
        """End attempt ``token``'s ``torchrun`` on every runner (``grace_s``) and its group.

        A runner left with no other attempt is ended too, unless it is the asking
        driver's (named ``keep*``): it is a dead driver's, since a live driver ends its
        own attempts. Returns the runners where the attempt still runs.
        """
        import contextlib

        import ray

        holding = self._holding(token, prefix, namespace, running=False)
        endings = [handle.terminate.remote(token, grace_s) for _, handle in holding]
        for ending in endings:
            with contextlib.suppress(Exception):  # a dead runner took its torchrun with it
                ray.get(ending, timeout=grace_s + 15)
        for name, handle in holding:
            with contextlib.suppress(Exception):
                others = ray.get(handle.release.remote(token), timeout=30)
                if others == 0 and not name.startswith(keep):
                    ray.kill(handle, no_restart=True)
        with contextlib.suppress(Exception):  # no such group (left already)
            ray.util.remove_placement_group(ray.util.get_placement_group(group))
        return self.holders(token, prefix, namespace)

    def _holding(
        self, token: str, prefix: str, namespace: str, *, running: bool
    ) -> list[tuple[str, Any]]:
        import contextlib

        import ray

        handles: list[tuple[str, Any]] = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == namespace and entry["name"].startswith(prefix):
                with contextlib.suppress(ValueError):  # ended meanwhile
                    handles.append(
                        (entry["name"], ray.get_actor(entry["name"], namespace=namespace))
                    )
        asked: list[tuple[str, Any, Any]] = [
            (name, handle, handle.holds.remote(token, running=running)) for name, handle in handles
        ]
        holding: list[tuple[str, Any]] = []
        for name, handle, ref in asked:
            with contextlib.suppress(Exception):  # a dead runner holds nothing
                if ray.get(ref, timeout=30):
                    holding.append((name, handle))
        return holding
