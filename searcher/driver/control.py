"""Who runs the experiment and what they asked for: ownership, heartbeat, Ctrl-C, the end.

A driver owns its experiment through the experiment row (its host, pid and heartbeat;
:func:`claim_ownership`). Every heartbeat (:func:`heartbeat`) renews that claim and its
slot leases, and picks up what ``slotsweep pause|kill`` or the UI wrote into
``requested_action`` (:mod:`trials.coordination.control` writes it). Ctrl-C asks for a pause, a
second one stops at once (:func:`install_signal_handlers`). Both end up in one
:class:`Control`, which the driver's tick loop reads. :func:`finish` writes the final
state.

Example (a driver also calls ``install_signal_handlers(control)`` first, so that
Ctrl-C sets ``control.action``; an example would replace the test runner's own):

    >>> from trials.coordination.control import request_action
    >>> control = Control()
    >>> claim_ownership(ctx)
    >>> request_action(url, ctx.experiment_id, "pause")  # what `slotsweep pause 1` does
    'Requested pause of experiment 1; its driver (pid ... on ...) acts on it at its next poll (running trials checkpoint and stop, then it is PAUSED).'
    >>> heartbeat(ctx, control)
    >>> control.action
    <Stop.PAUSE: 'pause'>
"""

from __future__ import annotations

import enum
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from sqlalchemy import select

from searcher.driver.context import DriverContext, driver_log
from searcher.experiments import UsageError
from storage import Experiment, ExperimentState, Trial, TrialState, session_scope, utcnow
from trials.coordination import allocations as slot_ledger
from trials.coordination import cluster_queue
from trials.coordination.control import Action, driver_alive
from trials.retention import collect_garbage

_log = driver_log


class Stop(str, enum.Enum):
    """How the driver ends its search early: what Ctrl-C, ``slotsweep pause|kill`` or
    fail-fast asked for (its values are :class:`~trials.coordination.control.Action`'s where they meet).
    """

    #: No new trials; running ones checkpoint and stop; the experiment is PAUSED.
    PAUSE = "pause"
    #: Running trials stop now and fail; the experiment is CANCELED.
    KILL = "kill"
    #: The experiment must stop (fail-fast): trials fail with its reason; it is ERROR.
    ERROR = "error"


class CtrlC:
    """Ctrl-C presses, counted by a SIGINT handler of its own while installed: the first
    calls ``on_first``, a second raises :class:`KeyboardInterrupt`.

    A handler of its own rather than Python's, whose :class:`KeyboardInterrupt` is lost
    when it lands in a finalizer (``Exception ignored in ...``) run by database work:
    the first press then did nothing. Installed only in the main thread, the only one
    Python lets install one and the only one a Ctrl-C interrupts; elsewhere
    :meth:`install` does nothing.
    """

    def __init__(self, on_first: Callable[[], None] = lambda: None) -> None:
        self.pressed = 0
        self._on_first = on_first
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True

    def restore(self) -> None:
        """Put back the handler :meth:`install` replaced."""
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def __enter__(self) -> CtrlC:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.pressed += 1
        if self.pressed == 1:
            self._on_first()
        else:
            raise KeyboardInterrupt


@dataclass
class Control:
    """What Ctrl-C and ``slotsweep pause|kill`` asked for."""

    action: Stop | None = None
    ctrl_c: CtrlC = field(default_factory=CtrlC)
    #: Why the experiment must stop (action ERROR), for the failed trials' errors.
    stop_reason: str = ""

    @property
    def interrupts(self) -> int:
        """How many times Ctrl-C was pressed."""
        return self.ctrl_c.pressed


def claim_ownership(ctx: DriverContext) -> None:
    """Make this process the experiment's driver (state ACTIVE, a fresh heartbeat).

    Raises :class:`~searcher.experiments.UsageError` for an experiment that ended, or
    one another live driver runs.
    """
    with session_scope(ctx.db_url) as session:
        experiment = session.get(Experiment, ctx.experiment_id)
        assert experiment is not None
        if experiment.state.is_terminal:
            raise UsageError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is "
                f"{experiment.state.value}; it cannot run again"
                + (
                    f" (`slotsweep continue {experiment.id} --more-trials K` extends it)"
                    if experiment.state == ExperimentState.COMPLETED
                    else ""
                )
            )
        if driver_alive(experiment) and experiment.driver_pid != os.getpid():
            raise UsageError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is being run by "
                f"pid {experiment.driver_pid} on {experiment.driver_host}"
            )
        experiment.state = ExperimentState.ACTIVE
        experiment.requested_action = None
        experiment.driver_host = socket.gethostname()
        experiment.driver_pid = os.getpid()
        experiment.driver_heartbeat_at = utcnow()


class DriverReplacedError(UsageError):
    """Another driver owns the experiment now (this one was stopped, and was resumed).

    While a driver is stopped (SIGSTOP, a suspended machine) its heartbeat goes stale and
    ``slotsweep resume`` may take the experiment over, ending what it left running. The
    stopped driver, once continued, must leave everything to the new owner.
    """


def heartbeat(ctx: DriverContext, control: Control) -> float | None:
    """Write the driver's heartbeat, take up a requested pause or kill, renew the slot leases.

    Returns the previous heartbeat's age in seconds when it was older than the lease,
    else None: this driver was stopped (SIGSTOP, a suspended machine, a long stall)
    long enough for other drivers to act on its leases, and must re-validate its
    claims and runs before anything else. Raises :class:`DriverReplacedError` when
    another driver took the experiment over meanwhile.
    """
    with session_scope(ctx.db_url) as session:
        experiment = session.get(Experiment, ctx.experiment_id)
        assert experiment is not None
        if (experiment.driver_host, experiment.driver_pid) != (socket.gethostname(), os.getpid()):
            owner = (
                f"pid {experiment.driver_pid} on {experiment.driver_host}"
                if experiment.driver_pid is not None
                else "no driver (it was paused or killed)"
            )
            raise DriverReplacedError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is run by {owner} now; "
                "this driver was stopped for too long and leaves it"
            )
        now = utcnow()
        previous = experiment.driver_heartbeat_at
        experiment.driver_heartbeat_at = now
        if (
            experiment.requested_action in (Action.PAUSE, Action.KILL)
            and control.action != Stop.KILL
        ):
            control.action = Stop(experiment.requested_action)
        slot_ledger.renew_leases(session, ctx.experiment_id, ctx.timings.lease_s)
    age_s = (now - previous).total_seconds() if previous is not None else 0.0
    return age_s if age_s > ctx.timings.lease_s else None


def finish(
    ctx: DriverContext,
    state: ExperimentState,
    control: Control,
    fail: Callable[[Trial], None],
    not_run: Callable[[Trial], None],
) -> None:
    """Write the experiment's final ``state`` and give up ownership (one transaction).

    A completed experiment's checkpoints are garbage-collected. A killed or stopped one
    ends its queued trials: one that never started (asked, maybe ahead of its slots) with
    ``not_run`` (:meth:`searcher.driver.outcomes.Outcomes.not_run`: no failure of the search),
    one that ran before and waits for a restart with ``fail``
    (:meth:`searcher.driver.outcomes.Outcomes.fail`). Both queue Optuna's tells: flush them
    after this returns.
    """
    with session_scope(ctx.db_url) as session:
        if state == ExperimentState.COMPLETED:
            collect_garbage(
                session,
                experiment_id=ctx.experiment_id,
                policy=ctx.config.checkpoint_storage,
                metric=ctx.config.searcher.metric,
                smaller_is_better=ctx.config.searcher.smaller_is_better,
            )
        experiment = session.get(Experiment, ctx.experiment_id)
        assert experiment is not None
        if state in (ExperimentState.CANCELED, ExperimentState.ERROR):
            for trial in session.scalars(
                select(Trial).where(
                    Trial.experiment_id == ctx.experiment_id,
                    Trial.state == TrialState.QUEUED,
                )
            ):
                trial.error = (
                    "experiment killed before the trial ran"
                    if state == ExperimentState.CANCELED
                    else f"experiment stopped before the trial ran: {control.stop_reason}"
                )
                (not_run if trial.started_at is None else fail)(trial)
        # Its waiting trials leave the cluster's queue until a driver runs it again.
        cluster_queue.leave(session, ctx.experiment_id)
        experiment.state = state
        experiment.requested_action = None
        experiment.driver_heartbeat_at = None
        experiment.driver_pid = None
        if state.is_terminal:
            experiment.ended_at = utcnow()


def install_signal_handlers(control: Control) -> None:
    """Ctrl-C once: pause (no new trials; running ones checkpoint and stop); twice: stop now.

    Outside the main thread no handler can be installed, and none is.
    """

    def pause() -> None:
        _log.warning(
            "Ctrl-C: no new trials; running trials checkpoint and stop (Ctrl-C again to stop now)"
        )
        control.action = Stop.PAUSE

    control.ctrl_c = CtrlC(pause)
    control.ctrl_c.install()


def restore_signal_handlers(control: Control) -> None:
    """Put back the handler :func:`install_signal_handlers` replaced."""
    control.ctrl_c.restore()
