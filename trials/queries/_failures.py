"""How trials failed: an experiment's failures and their commonest reason, why the driver
stopped it early, and a trial's recorded traceback (the Experiment and Trial pages).

Example:
    >>> from storage import get_engine
    >>> from trials.queries import experiment_summary
    >>> engine = get_engine(url, read_only=True)
    >>> failure_summary(engine, 1, experiment_summary(engine, 1).trials)
    FailureSummary(failed=0, completed=0, reason=None, reason_count=0)
    >>> trial_failure(engine, 1) is None
    True
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from storage import Experiment, ExperimentState, Trial, TrialFailure, TrialRun, TrialState
from trials.config import ExperimentConfig
from trials.queries._experiments import TrialCounts
from trials.queries._reading import Source, enum_value, reading

_E = Experiment.__table__
_T = Trial.__table__
_R = TrialRun.__table__
_F = TrialFailure.__table__


@dataclasses.dataclass(frozen=True)
class FailureSummary:
    """How an experiment's trials failed: how many, and the commonest recorded reason."""

    failed: int
    completed: int
    reason: str | None
    reason_count: int

    @property
    def all_failed(self) -> bool:
        return self.failed > 0 and self.completed == 0


def failure_summary(db: Source, experiment_id: int, counts: TrialCounts) -> FailureSummary:
    """How many of the experiment's trials failed, of ``counts`` (its trial counts, as
    the caller read them: they are not counted twice), and their commonest error,
    grouped in SQL."""
    with reading(db) as conn:
        commonest = conn.execute(
            sa.select(_T.c.error, sa.func.count().label("n"))
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.ERROR,
                _T.c.error.is_not(None),
            )
            .group_by(_T.c.error)
            .order_by(sa.func.count().desc(), _T.c.error)
            .limit(1)
        ).first()
    return FailureSummary(
        failed=counts.errored,
        completed=counts.completed,
        reason=None if commonest is None else str(commonest.error),
        reason_count=0 if commonest is None else int(commonest.n),
    )


# What the driver writes into the error of trials it ends when it stops the experiment
# (``searcher.driver.running`` and ``searcher.driver.control``), before the stop's reason.
_STOPPED_PREFIXES = ("experiment stopped before the trial ran: ", "experiment stopped: ")


def fail_fast_stop(db: Source, experiment_id: int, config: ExperimentConfig | None) -> str | None:
    """Why the driver stopped the experiment early (``fail_fast_trials``), or None.

    The driver logs ``stopping the experiment: REASON (fail_fast_trials: N)`` and
    writes REASON into the error of the trials it ends then. When no trial was left to
    end, the rule is read back from the trials: the first N (by number) all failed
    with one error and none succeeded.
    """
    limit = 0 if config is None else config.fail_fast_trials
    with reading(db) as conn:
        state = conn.execute(sa.select(_E.c.state).where(_E.c.id == experiment_id)).scalar()
        if enum_value(state) != ExperimentState.ERROR.value or limit <= 0:
            return None
        trials = conn.execute(
            sa.select(_T.c.state, _T.c.error)
            .where(_T.c.experiment_id == experiment_id)
            .order_by(_T.c.optuna_trial_number)
        ).all()
    for trial in trials:
        for prefix in _STOPPED_PREFIXES:
            if (trial.error or "").startswith(prefix):
                return f"{trial.error.removeprefix(prefix)} (fail_fast_trials: {limit})"
    states = [enum_value(t.state) for t in trials]
    first = trials[:limit]
    if (
        len(first) < limit
        or any(s in (TrialState.COMPLETED.value, TrialState.PRUNED.value) for s in states)
        or any(enum_value(t.state) != TrialState.ERROR.value for t in first)
        or len({t.error for t in first}) != 1
    ):
        return None
    return (
        f"the first {limit} trials all failed with the same error and none succeeded: "
        f"{first[0].error} (fail_fast_trials: {limit})"
    )


def failed_trial_log(db: Source, experiment_id: int, error: str) -> str | None:
    """The log path of the newest failed trial that recorded ``error``, if it has one."""
    with reading(db) as conn:
        path = conn.execute(
            sa.select(_T.c.log_path)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.ERROR,
                _T.c.error == error,
                _T.c.log_path.is_not(None),
            )
            .order_by(_T.c.id.desc())
            .limit(1)
        ).scalar()
    return None if path is None else str(path)


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """What the first rank of a trial's latest failed run recorded."""

    attempt: int
    rank: int
    exception: str
    traceback: str

    @property
    def who(self) -> str:
        """``rank N``, or ``torchrun`` for a failure torchrun recorded itself."""
        return "torchrun" if self.rank == TrialFailure.TORCHRUN_RANK else f"rank {self.rank}"


def trial_failure(db: Source, trial_id: int) -> RankFailure | None:
    """The first recorded failure of the trial's latest run that has one, if any."""
    with reading(db) as conn:
        row = conn.execute(
            sa.select(_R.c.attempt, _F.c.rank, _F.c.exception_type, _F.c.message, _F.c.traceback)
            .join(_R, _R.c.id == _F.c.run_id)
            .where(_F.c.trial_id == trial_id)
            .order_by(_R.c.attempt.desc(), _F.c.recorded_at, _F.c.id)
            .limit(1)
        ).first()
    if row is None:
        return None
    return RankFailure(
        attempt=row.attempt,
        rank=row.rank,
        exception=f"{row.exception_type}: {row.message}",
        traceback=row.traceback,
    )


def failure_traceback(db: Source, experiment_id: int, error: str) -> str | None:
    """The traceback a rank recorded for the newest failed trial that recorded ``error``."""
    with reading(db) as conn:
        text = conn.execute(
            sa.select(_F.c.traceback)
            .join(_T, _T.c.id == _F.c.trial_id)
            .where(
                _T.c.experiment_id == experiment_id,
                _T.c.state == TrialState.ERROR,
                _T.c.error == error,
            )
            .order_by(_F.c.trial_id.desc(), _F.c.rank)
            .limit(1)
        ).scalar()
    return None if not text else str(text)
