"""The executor seam: where a trial attempt's processes run, behind one interface.

The driver decides *what* runs and *on which slots* (the scheduler's placement); an
executor decides *how* the processes get there: this machine's process table
(:class:`~trials.executors.LocalExecutor`) or a Slurm allocation's job steps
(:class:`~trials.executors.SlurmExecutor`). Every executor runs ``torchrun`` with
c10d rendezvous on the placement's first agent, passes the spec and the database URL
in the environment, and keeps the reliability rules of :mod:`trials.coordination.attempts`: an
attempt's processes are one unit, and they are confirmed gone before its slots are
freed or its next attempt starts.

A driver holds a :class:`TrialJob` for each attempt it started. After a driver crash
the database row of the run (``TrialRun.executor``, ``external_id``, launch token) is
all that is left, and :meth:`Executor.end_leftovers` / :meth:`Executor.leftovers_gone`
work from that alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from storage import TrialRun
    from trials.scheduler import Placement


@dataclass(frozen=True)
class LaunchRequest:
    """Everything an executor needs to start one attempt of a trial.

    ``placement`` is where the scheduler put it; None for an executor that places
    trials itself (:attr:`Executor.places_trials`), which gets ``slots`` only.
    ``spec_json`` is the trial's :class:`~trials.RuntimeSpec` without the database URL;
    ``env`` reaches every rank (the database URL, network settings) and is where
    secrets go: never a command line.
    """

    placement: Placement | None
    slots: int
    spec_json: str
    rdzv_id: str
    token: str
    log_path: Path
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobEnding:
    """How an ended attempt's executor saw it end, beyond its exit code."""

    #: The cluster stopped it on its own account (preempted, time limit): the trial
    #: resumes from its latest checkpoint, and it is no failure of the trial.
    stopped_by_cluster: str | None = None
    #: Why it ended when that was neither the trial nor the driver (a cancelled job).
    cause: str | None = None


class TrialJob(Protocol):
    """A started attempt, as the driver that started it sees it."""

    @property
    def external_id(self) -> str | None:
        """The executor's own id of the attempt (a Slurm job step), if it has one."""
        ...

    def poll(self) -> int | None:
        """None while the attempt runs; else its exit code (the first failure's)."""
        ...

    def end(self, *, grace_s: float) -> bool:
        """Stop every process of the attempt (SIGTERM, ``grace_s``, SIGKILL); whether all are gone."""
        ...

    def record(self, session: Session, run: TrialRun) -> None:
        """Write what finds the attempt again after a crash into ``run`` (pids, step id)."""
        ...

    def describe(self) -> list[dict[str, Any]]:
        """Where the attempt runs, one entry per agent (the run's ``agents`` record)."""
        ...

    def waiting_reason(self) -> str | None:
        """Why no process of the attempt runs yet (queued in a cluster engine), or None."""
        ...

    def ending(self) -> JobEnding:
        """How the attempt ended, once :meth:`poll` returned its exit code."""
        ...


class Executor(Protocol):
    """Starts attempts and ends what a crashed driver left behind."""

    #: Stored in ``TrialRun.executor``; :func:`~trials.executors.executor_named` finds it.
    name: str
    #: Whether ranks may run on hosts other than the driver's (SQLite is refused then).
    remote: bool
    #: Whether the executor's cluster engine picks the nodes (launch gets no placement,
    #: and the slot ledger is the engine's own).
    places_trials: bool
    #: Whether it can run several trials on one slot at once, each on its share
    #: (``resources.slots_per_trial`` 0.5, 0.25, 0.125): it starts processes on the
    #: ledger's own slots. One whose engine hands out whole GPUs itself cannot.
    shares_slots: bool

    def launch(self, request: LaunchRequest) -> TrialJob:
        """Start the attempt's processes on ``request.placement``."""
        ...

    def end_leftovers(self, session: Session, run: TrialRun, *, grace_s: float) -> bool:
        """End whatever of ``run`` still runs (known only from the database); whether all is gone."""
        ...

    def unavailable_agents(self, names: Sequence[str]) -> frozenset[str]:
        """Which of the agents ``names`` cannot take a trial now (a lost or drained node)."""
        ...

    def leftovers_gone(self, session: Session, run: TrialRun) -> bool:
        """Whether nothing of ``run`` runs any more (confirmed, not assumed)."""
        ...
