"""What an ended attempt means: completed, pruned, restarted, or failed, and what Optuna hears.

The decision is a pure function, :func:`decide_outcome`: the facts a trial recorded
(:class:`OutcomeFacts`) in, a :class:`OutcomeDecision` out. :class:`Outcomes` does the
I/O around it: it reads the facts from the database, applies the decision to the
trial's row, writes the failure line and queues Optuna's tell. What the driver must do
besides, it returns as :mod:`searcher.driver.decisions`: queue the trial again, or stop the
experiment when its first trials all failed the same way (``fail_fast_trials``).

torchrun can exit non-zero after a finished run (gloo teardown), so the record, not
the exit code, decides.

A port clash (a port the attempt was given taken before it started:
:func:`searcher.driver.failures.is_port_clash`) is no failure either: the trial is queued
again at once, its restarts unchanged, and its next attempt gets fresh ports. Only
:data:`PORT_CLASH_RETRIES` clashes in a row go uncounted: a port that is always taken
is no race.

Example:
    >>> decision = decide_outcome(OutcomeFacts(
    ...     pruned=False, finished=False, has_metric=False, metric="val_loss",
    ...     last_validation_nan=False, verdict=None, exit_code=1, cause=None,
    ...     restarts=0, max_restarts=2))
    >>> decision.state.value, decision.error
    ('QUEUED', 'exit code 1; restart 1 of 2')
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.driver.context import DriverContext, driver_log
from searcher.driver.control import Control
from searcher.driver.decisions import Decision, Requeue, StopExperiment
from searcher.driver.failures import (
    FailureRecord,
    RunVerdict,
    TrialOutcome,
    fail_fast_reason,
    judge_run,
)
from searcher.driver.study_side import TellQueue, objective_values
from storage import Metric, MetricKind, Trial, TrialFailure, TrialRun, TrialState, utcnow
from trials.launch.launcher import write_log_line

_log = driver_log

#: What Optuna is told: the objective values, PRUNED, or FAIL.
OptunaTell = Literal["values", "pruned", "fail"]

#: Port clashes in a row that a trial is started again after without counting a restart.
PORT_CLASH_RETRIES = 3
PORT_CLASH_NOTE = (
    "a port it was given was taken before it started (EADDRINUSE); "
    "starting it again with fresh ports, no restart counted"
)


@dataclass(frozen=True)
class OutcomeFacts:
    """What an ended attempt left behind, as :func:`decide_outcome` reads it.

    ``last_validation_nan`` matters only for a trial that finished without the
    searcher metric, ``verdict`` only for one that neither finished nor was pruned;
    :meth:`Outcomes.finalize` looks each up only then.
    """

    #: The trial recorded that the pruner stopped it.
    pruned: bool
    #: The trial recorded the end of its training.
    finished: bool
    #: The trial recorded a value of the searcher metric.
    has_metric: bool
    #: The searcher metric's name (for the error text).
    metric: str
    #: The metric's last validation was NaN (stored as NULL: training diverged).
    last_validation_nan: bool
    #: What the ranks of the latest run recorded as their failure, if any did.
    verdict: RunVerdict | None
    #: The attempt's exit code (None when no driver watched it end).
    exit_code: int | None
    #: Why the driver ended the attempt (a hang), if it did.
    cause: str | None
    #: Restarts the trial has had so far.
    restarts: int
    #: The experiment's ``max_restarts``.
    max_restarts: int
    #: The cluster stopped the attempt on its own account (preempted, time limit).
    stopped_by_cluster: str | None = None
    #: The trial's runs right before this one that ended in a port clash too.
    port_clashes_before: int = 0


@dataclass(frozen=True)
class OutcomeDecision:
    """What becomes of the trial: its new state, its error text, what Optuna is told."""

    #: COMPLETED, PRUNED, ERROR, or QUEUED (restarted from its latest checkpoint).
    state: TrialState
    #: The trial's new error text; None leaves it as it is.
    error: str | None = None
    #: The trial's new restart count when it is restarted.
    restarts: int | None = None
    #: What Optuna is told; None while the trial goes on.
    tell: OptunaTell | None = None
    #: Whether the failure is written to the driver's terminal and the trial's log.
    notify: bool = False
    #: Whether the experiment's first trials are then checked for one shared failure.
    check_fail_fast: bool = False
    #: A line for the driver's terminal, the trial's log and the run's reason when the
    #: trial goes on without a failure counted (a port clash).
    note: str | None = None

    @property
    def requeue(self) -> bool:
        """Whether the trial goes back to the pending queue (a restart)."""
        return self.state == TrialState.QUEUED


def decide_outcome(facts: OutcomeFacts) -> OutcomeDecision:
    """Decide COMPLETED / PRUNED / restart / FAIL from what the trial recorded.

    A failure is restarted while restarts are left, unless the run failed the same way
    on every rank before its first step (a bug: it is failed without restarts). The
    reason is the exception the first failing rank recorded, else the ``cause`` (a
    hang) or the exit code. An attempt the cluster stopped (preemption, time limit) is
    no failure: the trial resumes from its latest checkpoint, no restart counted; nor is
    a port clash, up to :data:`PORT_CLASH_RETRIES` in a row.

    Example:
        >>> facts = OutcomeFacts(pruned=True, finished=False, has_metric=False,
        ...     metric="val_loss", last_validation_nan=False, verdict=None,
        ...     exit_code=0, cause=None, restarts=0, max_restarts=2)
        >>> decide_outcome(facts).tell
        'pruned'
    """
    if facts.pruned:
        return OutcomeDecision(state=TrialState.PRUNED, tell="pruned")
    if facts.finished and facts.has_metric:
        return OutcomeDecision(state=TrialState.COMPLETED, tell="values")
    if facts.finished:
        error = (
            f"the searcher metric '{facts.metric}' was NaN at the end of training (it diverged)"
            if facts.last_validation_nan
            else f"the trial finished without reporting the searcher metric '{facts.metric}'"
        )
        return OutcomeDecision(state=TrialState.ERROR, error=error, tell="fail")
    if facts.stopped_by_cluster:
        return OutcomeDecision(state=TrialState.QUEUED, restarts=facts.restarts)
    verdict = facts.verdict
    if (
        verdict is not None
        and verdict.port_clash
        and facts.port_clashes_before < PORT_CLASH_RETRIES
    ):
        return OutcomeDecision(
            state=TrialState.QUEUED, restarts=facts.restarts, note=PORT_CLASH_NOTE
        )
    fallback_reason = facts.cause or f"exit code {facts.exit_code}"
    reason = verdict.reason if verdict is not None else fallback_reason
    if verdict is not None and verdict.deterministic:
        return OutcomeDecision(
            state=TrialState.ERROR,
            error=f"{reason}; it failed this way before its first step, so it is not restarted",
            tell="fail",
            notify=True,
            check_fail_fast=True,
        )
    if facts.restarts < facts.max_restarts:
        restarts = facts.restarts + 1
        return OutcomeDecision(
            state=TrialState.QUEUED,
            error=f"{reason}; restart {restarts} of {facts.max_restarts}",
            restarts=restarts,
            notify=True,
        )
    return OutcomeDecision(
        state=TrialState.ERROR,
        error=f"{reason}; failed after {facts.restarts} restarts",
        tell="fail",
        notify=True,
        check_fail_fast=True,
    )


class Outcomes:
    """Applies outcomes to trials: the database side of :func:`decide_outcome`.

    ``tells`` receives what Optuna is told. ``control`` is only read: once the
    experiment is stopping, ``fail_fast_trials`` is not checked again.
    """

    def __init__(self, ctx: DriverContext, tells: TellQueue, control: Control) -> None:
        self.ctx = ctx
        self.tells = tells
        self.control = control
        # A stop decided but not yet applied (the driver applies it after the stage).
        self._stop_decided = False

    def finalize(
        self,
        session: Session,
        trial: Trial,
        exit_code: int | None,
        cause: str | None = None,
        stopped_by_cluster: str | None = None,
    ) -> list[Decision]:
        """Record the outcome of the trial's ended attempt (its facts read in ``session``).

        Returns what the driver must do besides: :class:`~searcher.driver.decisions.Requeue` the
        trial, or :class:`~searcher.driver.decisions.StopExperiment`.
        """
        facts = self._facts(session, trial, exit_code, cause, stopped_by_cluster)
        decision = decide_outcome(facts)
        if decision.error is not None:
            trial.error = decision.error
        if decision.requeue:
            assert decision.restarts is not None
            trial.restarts = decision.restarts
            trial.state = TrialState.QUEUED
            if decision.notify:
                self._notify_failure(trial)
            if decision.note is not None:
                self._note(session, trial, decision.note)
            return [Requeue(trial_id=trial.id, slots=trial.slots_per_trial)]
        if decision.state == TrialState.ERROR:
            if decision.notify:
                self._notify_failure(trial)
            self.fail(trial)
            if decision.check_fail_fast:
                return self._check_fail_fast(session)
            return []
        import optuna

        trial.state = decision.state
        if decision.tell == "pruned":
            self.tells.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.tells.tell(trial, values=objective_values(self.ctx.config, trial))
        trial.ended_at = utcnow()
        return []

    def launch_failed(self, trial: Trial, exc: Exception) -> None:
        """Fail ``trial``, whose attempt could not start, with one line as every failure gets.

        The line is ``trial E.N failed: launch failed: <why>`` on the driver's terminal and
        in the trial's log; ``<why>`` is kept to one line there and in ``trial.error``.
        """
        trial.error = "launch failed: " + " ".join(str(exc).split())
        self._notify_failure(trial)
        self.fail(trial)

    def fail(self, trial: Trial) -> None:
        """Mark ``trial`` ERROR (its ``error`` says why) and queue Optuna's FAIL."""
        import optuna

        trial.state = TrialState.ERROR
        trial.ended_at = utcnow()
        self.tells.tell(trial, state=optuna.trial.TrialState.FAIL)

    def not_run(self, trial: Trial) -> None:
        """End ``trial``, asked and never started, as NOT_RUN (its ``error`` says why).

        No failure of the search: the experiment ended first. Optuna, which has no state
        for it, hears FAIL, so that no trial is left RUNNING there.
        """
        import optuna

        trial.state = TrialState.NOT_RUN
        trial.ended_at = utcnow()
        self.tells.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _facts(
        self,
        session: Session,
        trial: Trial,
        exit_code: int | None,
        cause: str | None,
        stopped_by_cluster: str | None = None,
    ) -> OutcomeFacts:
        """The trial's facts, looking up only those :func:`decide_outcome` will read."""
        pruned = trial.pruned_at is not None
        finished = trial.finished_at is not None
        has_metric = trial.searcher_metric_value is not None
        metric = self.ctx.config.searcher.metric
        verdict = None if pruned or finished else _run_verdict(session, trial)
        return OutcomeFacts(
            pruned=pruned,
            finished=finished,
            has_metric=has_metric,
            metric=metric,
            last_validation_nan=(
                not pruned
                and finished
                and not has_metric
                and _last_validation_is_nan(session, trial.id, metric)
            ),
            verdict=verdict,
            exit_code=exit_code,
            cause=cause,
            restarts=trial.restarts,
            max_restarts=self.ctx.config.max_restarts,
            stopped_by_cluster=stopped_by_cluster,
            port_clashes_before=(
                _port_clashes_before(session, trial)
                if verdict is not None and verdict.port_clash
                else 0
            ),
        )

    def _notify_failure(self, trial: Trial) -> None:
        """One line on the driver's terminal and in the trial's log."""
        label = f"trial {self.ctx.label(trial.optuna_trial_number)}"
        _log.warning("%s failed: %s", label, trial.error)
        if trial.log_path:
            with contextlib.suppress(OSError):
                write_log_line(Path(trial.log_path), f"{label} failed: {trial.error}")

    def _note(self, session: Session, trial: Trial, note: str) -> None:
        """One line on the driver's terminal and in the trial's log; the latest run's reason."""
        label = f"trial {self.ctx.label(trial.optuna_trial_number)}"
        _log.warning("%s: %s", label, note)
        run = _latest_run(session, trial.id)
        if run is not None:
            run.reason = note
        if trial.log_path:
            with contextlib.suppress(OSError):
                write_log_line(Path(trial.log_path), f"{label}: {note}")

    def _check_fail_fast(self, session: Session) -> list[Decision]:
        """Stop the experiment (ERROR) when its first trials all failed the same way."""
        limit = self.ctx.config.fail_fast_trials
        if limit <= 0 or self.control.action is not None or self._stop_decided:
            return []
        session.flush()
        outcomes = []
        for trial in session.scalars(
            select(Trial).where(Trial.experiment_id == self.ctx.experiment_id)
        ):
            succeeded: bool | None = None
            signature: tuple[str, str] | str | None = None
            if trial.state in (TrialState.COMPLETED, TrialState.PRUNED):
                succeeded = True
            elif trial.state == TrialState.ERROR:
                succeeded = False
                verdict = _run_verdict(session, trial)
                signature = verdict.signature if verdict is not None else trial.error
            outcomes.append(TrialOutcome(trial.optuna_trial_number, succeeded, signature))
        reason = fail_fast_reason(outcomes, limit)
        if reason is not None:
            _log.warning("stopping the experiment: %s (fail_fast_trials: %d)", reason, limit)
            self._stop_decided = True
            return [StopExperiment(reason)]
        return []


def _latest_run(session: Session, trial_id: int) -> TrialRun | None:
    return session.scalars(
        select(TrialRun)
        .where(TrialRun.trial_id == trial_id)
        .order_by(TrialRun.attempt.desc())
        .limit(1)
    ).first()


def _failures_of_latest_run(session: Session, trial_id: int) -> list[FailureRecord]:
    """What the ranks of the trial's latest run recorded, in the order they failed."""
    run = _latest_run(session, trial_id)
    return [] if run is None else _failures_of_run(session, run.id)


def _failures_of_run(session: Session, run_id: int) -> list[FailureRecord]:
    """What the ranks of one run recorded, in the order they failed."""
    rows = session.scalars(
        select(TrialFailure)
        .where(TrialFailure.run_id == run_id)
        .order_by(TrialFailure.recorded_at, TrialFailure.id)
    )
    return [
        FailureRecord(row.rank, row.exception_type, row.message, row.steps_completed)
        for row in rows
    ]


def _run_verdict(session: Session, trial: Trial) -> RunVerdict | None:
    return judge_run(_failures_of_latest_run(session, trial.id), world_size=trial.slots_per_trial)


def _port_clashes_before(session: Session, trial: Trial) -> int:
    """How many of the trial's runs right before its latest one ended in a port clash."""
    earlier = session.scalars(
        select(TrialRun.id)
        .where(TrialRun.trial_id == trial.id)
        .order_by(TrialRun.attempt.desc())
        .offset(1)
        .limit(PORT_CLASH_RETRIES)
    )
    clashes = 0
    for run_id in earlier:
        verdict = judge_run(_failures_of_run(session, run_id), world_size=trial.slots_per_trial)
        if verdict is None or not verdict.port_clash:
            break
        clashes += 1
    return clashes


def _last_validation_is_nan(session: Session, trial_id: int, metric: str) -> bool:
    """Whether ``metric``'s last validation was NaN (stored as NULL: training diverged)."""
    row = session.execute(
        select(Metric.value)
        .where(
            Metric.trial_id == trial_id,
            Metric.kind == MetricKind.VALIDATION,
            Metric.name == metric,
        )
        .order_by(Metric.step.desc())
        .limit(1)
    ).first()
    return row is not None and row[0] is None
