"""The local executor: every agent's ``torchrun`` is a child process of the driver.

Agents must be this machine (any address of it): a placement on another host is
refused with a clear error. Leftovers of a crashed driver are found by their recorded
pids (checked against their kernel start time) and by the launch token every process
carries in its environment (:mod:`trials.launch.processes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trials._system_metrics import detect_gpus
from trials.executors._base import JobEnding
from trials.executors._process_rows import (
    end_local_processes,
    local_processes_gone,
    record_launch,
)
from trials.launch.launcher import (
    SPEC_ENV_VAR,
    TrialProcesses,
    free_port,
    start_trial,
    torchrun_commands,
)
from trials.launch.shares import mps_running

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import TrialRun
    from trials.executors._base import LaunchRequest


@dataclass
class LocalJob:
    """An attempt whose ``torchrun`` processes are this driver's children."""

    processes: TrialProcesses

    @property
    def external_id(self) -> str | None:
        return None

    def poll(self) -> int | None:
        return self.processes.poll()

    def end(self, *, grace_s: float) -> bool:
        return self.processes.end(grace_s=grace_s)

    def record(self, session: Session, run: TrialRun) -> None:
        run.agents = self.processes.describe()
        record_launch(session, run, self.processes)

    def waiting_reason(self) -> str | None:
        return None  # started as soon as launched

    def ending(self) -> JobEnding:
        return JobEnding()

    def describe(self) -> list[dict[str, Any]]:
        return self.processes.describe()


class LocalExecutor:
    """Runs trials on this machine; GPUs by index when ``use_gpus``, else CPU slots (gloo).

    ``use_gpus=None`` asks NVML at the first launch whether this machine has GPUs.

    Example:
        >>> executor = LocalExecutor(use_gpus=False)
        >>> executor.name, executor.remote
        ('local', False)
    """

    name = "local"
    remote = False
    places_trials = False
    # Its processes go on the ledger's slots, so several may share one (shares).
    shares_slots = True

    def __init__(self, *, use_gpus: bool | None = None) -> None:
        self.use_gpus = use_gpus

    def launch(self, request: LaunchRequest) -> LocalJob:
        if request.placement is None:
            raise RuntimeError("the local executor starts placed trials only")
        agents = request.placement.agents
        rdzv_port = free_port(agents[0].agent.host) if len(agents) > 1 else None
        if self.use_gpus is None:
            self.use_gpus = bool(detect_gpus())
        commands = torchrun_commands(
            request.placement,
            rdzv_id=request.rdzv_id,
            rdzv_port=rdzv_port,
            use_gpus=self.use_gpus,
            # Asked at each launch: an MPS daemon may be started or stopped meanwhile.
            mps=self.use_gpus and request.placement.share < 1.0 and mps_running(),
        )
        processes = start_trial(
            commands,
            log_path=request.log_path,
            cwd=request.cwd,
            token=request.token,
            extra_env={SPEC_ENV_VAR: request.spec_json, **request.env},
        )
        return LocalJob(processes)

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        return end_local_processes(session, run, grace_s=grace_s)

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        return local_processes_gone(session, run)

    def unavailable_agents(self, names: Sequence[str]) -> frozenset[str]:
        # This machine is up while the driver runs on it.
        return frozenset()
