"""The Optuna side of the search driver: ask for trials, write their rows, tell outcomes.

Optuna keeps its own tables (through its own connection) beside ours, so the two can
disagree after a crash: a trial asked whose row was never written, an outcome recorded
here but never told. :class:`StudySide` owns the study and closes both gaps on resume
(:meth:`StudySide.adopt_unwritten`, :meth:`StudySide.reconcile`). Outcomes are queued
(:class:`TellQueue`) and told only after our transaction commits.

Example:
    >>> from searcher.driver.placement import PendingQueue
    >>> pending = PendingQueue(ctx)
    >>> side = StudySide.load(ctx, trials_so_far=1, tells=TellQueue())
    >>> side.fill_queue(running=0, pending=pending)
    1
    >>> len(pending), side.trials_left()
    (1, 6)
    >>> side.flush_tells()
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select

import searcher.submit.samplers as samplers
import searcher.submit.space as space
from searcher.driver.context import DriverContext, driver_log
from storage import (
    ExperimentState,
    Trial,
    TrialState,
    optuna_storage,
    optuna_trial_id,
    optuna_writes_together,
    retry_transient,
    session_scope,
    study_trials,
    utcnow,
)
from trials.config import ExperimentConfig
from trials.queries import trial_counts, trial_total

if TYPE_CHECKING:
    import optuna

_log = driver_log


class TrialQueue(Protocol):
    """Where new trials wait for slots (:class:`searcher.driver.placement.PendingQueue`)."""

    def __len__(self) -> int:
        """How many trials wait."""

    def queue(self, trial: Trial) -> None:
        """Add ``trial`` (once)."""


def max_trials(config: ExperimentConfig) -> int:
    """How many trials the search asks for: ``max_trials``, or fewer for a smaller grid.

    Example:
        >>> max_trials(config)
        8
    """
    limit = config.searcher.max_trials
    if config.searcher.name == "grid":
        limit = min(limit, space.grid_size(config.hyperparameters))
    return limit


def missing_hparams(config: ExperimentConfig, hparams: dict[str, Any]) -> list[str]:
    """The config's hyperparameters that ``hparams`` has no value for, sorted.

    A trial missing one would train with settings nobody chose, so it never runs.

    Example:
        >>> hparams = dict(trial.hparams)
        >>> missing_hparams(config, hparams)
        []
        >>> del hparams["lr"], hparams["optimizer"]
        >>> missing_hparams(config, hparams)
        ['lr', 'optimizer']
    """
    return sorted(set(config.hyperparameters) - set(hparams))


def objective_values(config: ExperimentConfig, trial: Trial) -> list[float]:
    """What Optuna is told for a completed trial: the searcher metric, then each extra objective.

    ``slot_seconds`` is the trial's recorded slot-seconds; a wall-clock objective is the
    time since the trial first started.

    Example:
        >>> from trials.config import ObjectiveConfig
        >>> trial.searcher_metric_value, trial.slot_seconds = 0.21, 64.0
        >>> objective_values(config, trial)
        [0.21]
        >>> extra = [ObjectiveConfig(name="slot_seconds")]  # `objectives: [slot_seconds]`
        >>> searcher = config.searcher.model_copy(update={"objectives": extra})
        >>> objective_values(config.model_copy(update={"searcher": searcher}), trial)
        [0.21, 64.0]
    """
    assert trial.searcher_metric_value is not None
    values = [float(trial.searcher_metric_value)]
    for objective in config.searcher.objectives:
        if objective.name == "slot_seconds":
            values.append(float(trial.slot_seconds))
        else:
            wall = (utcnow() - trial.started_at).total_seconds() if trial.started_at else 0.0
            values.append(wall)
    return values


@dataclass
class TellQueue:
    """Outcomes for Optuna, queued during our transaction and told after its commit.

    Optuna uses its own connection: calling it inside one of our open SQLite
    transactions would wait on our own write lock.

    Example:
        >>> import optuna
        >>> study = optuna.load_study(study_name=ctx.study_name, storage=url)
        >>> tells = TellQueue()
        >>> tells.tell(trial, state=optuna.trial.TrialState.PRUNED)
        >>> tells.flush(study)
        >>> study.trials[trial.optuna_trial_number].state
        <TrialState.PRUNED: 2>
    """

    queued: list[tuple[int, list[float] | None, optuna.trial.TrialState | None]] = field(
        default_factory=list
    )

    def tell(
        self,
        trial: Trial,
        *,
        values: list[float] | None = None,
        state: optuna.trial.TrialState | None = None,
    ) -> None:
        """Queue the outcome for Optuna; :meth:`flush` sends it after our commit."""
        self.queued.append((trial.optuna_trial_number, values, state))

    def flush(self, study: optuna.Study) -> None:
        """Tell ``study`` every queued outcome, oldest first; each leaves the queue once told."""
        while self.queued:
            number, values, state = self.queued[0]
            # skip_if_finished: a tell that landed before a crash is not repeated.
            study.tell(number, values, state=state, skip_if_finished=True)
            self.queued.pop(0)


class StudySide:
    """The experiment's Optuna study: asking trials, writing their rows, telling outcomes."""

    def __init__(self, ctx: DriverContext, study: optuna.Study, tells: TellQueue) -> None:
        self.ctx = ctx
        self.study = study
        self.tells = tells

    @classmethod
    def load(cls, ctx: DriverContext, trials_so_far: int, tells: TellQueue) -> StudySide:
        """Load the experiment's study with its sampler and pruner.

        ``trials_so_far`` is how many trials the experiment already has (the sampler's
        start-up trials count them); outcomes queued in ``tells`` go to this study.
        """
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(
            study_name=ctx.study_name,
            storage=optuna_storage(ctx.db_url),
            sampler=samplers.build_sampler(ctx.config, trials_so_far=trials_so_far),
            pruner=samplers.build_pruner(ctx.config),
        )
        return cls(ctx, study, tells)

    def flush_tells(self) -> None:
        """Tell Optuna every outcome queued so far (call it after the commit)."""
        self.tells.flush(self.study)

    def _trials(self, state: optuna.trial.TrialState) -> list[optuna.trial.FrozenTrial]:
        """The study's trials in ``state``, read through storage's gateway to Optuna."""
        return study_trials(self.ctx.db_url, self.ctx.study_name, states=(state,)) or []

    # ----------------------------------------------------------------- asking
    def search_done(self) -> bool:
        """Whether no trial is left to ask for."""
        return self.trials_left() <= 0

    def trials_left(self, *, enough: int | None = None) -> int:
        """Trials still to ask for: up to max_trials, plus any a user enqueued beyond it.

        A count of at least ``enough`` within max_trials is final without reading the
        trials users enqueued (Optuna's read of a study's unfinished trials).
        """
        import optuna

        with session_scope(self.ctx.db_url) as session:
            total = trial_total(session, self.ctx.experiment_id)
        left = max_trials(self.ctx.config) - total
        if enough is not None and left >= enough:
            return left
        return max(left, len(self._trials(optuna.trial.TrialState.WAITING)))

    def fill_queue(
        self, running: int, pending: TrialQueue, *, ahead: int = 0, most: int | None = None
    ) -> int:
        """Ask Optuna for new trials while there is room to run them, and ``ahead`` more.

        ``running`` attempts and the ``pending`` trials together stay within
        ``max_concurrent_trials`` plus ``ahead``; each new trial's row is written, then
        queued. ``ahead`` trials are asked before any slot is free for them (the sampler
        treats the running ones as concurrent trials: TPE's constant liar), so that a
        warm job's next trial is ready the moment its current one hands the job back;
        the pending queue offers the cluster only what the free room allows
        (:meth:`searcher.driver.placement.PendingQueue.place`). Never past ``max_trials``: an
        asked trial runs (now, or after a resume) unless the experiment is killed.
        At ``most`` trials per call when given; returns how many were asked.
        """
        limit = self.ctx.config.searcher.max_concurrent_trials + ahead
        if running + len(pending) >= limit:
            return 0
        # Each ask takes one of the trials left (an enqueued one first): counted once.
        left = self.trials_left(enough=most)
        if most is not None:
            left = min(left, most)
        asked = 0
        while running + len(pending) < limit and left > 0:
            left -= 1
            asked += 1
            # The sampler hears every outcome recorded so far before it is asked.
            self.flush_tells()
            optuna_trial = self.study.ask()
            try:
                # The sampler's joint draw (TPE's, CMA-ES's) runs here, before the write
                # lock is taken; the suggestions then only store what it drew, at once.
                optuna_trial.relative_params  # noqa: B018
                with optuna_writes_together(optuna_storage(self.ctx.db_url)):
                    hparams = space.suggest_hparams(optuna_trial, self.ctx.config.hyperparameters)
            except BaseException:
                # Never leave a trial without its values where resume would adopt it.
                import optuna

                self.study.tell(optuna_trial, state=optuna.trial.TrialState.FAIL)
                raise

            # Asked from Optuna: its row must be written, or only a resume would find it.
            optuna_id = retry_transient(
                functools.partial(
                    optuna_trial_id, self.ctx.db_url, self.ctx.study_name, optuna_trial.number
                )
            )
            pending.queue(
                retry_transient(
                    functools.partial(
                        self.write_trial_row, optuna_trial.number, optuna_id, hparams
                    )
                )
            )
        return asked

    def new_trial_row(self, number: int, optuna_id: int, hparams: dict[str, Any]) -> Trial:
        """The QUEUED row of Optuna trial ``number`` (not added to any session)."""
        slots = int(hparams.get("slots_per_trial", self.ctx.config.resources.slots))
        return Trial(
            experiment_id=self.ctx.experiment_id,
            optuna_trial_id=optuna_id,
            optuna_trial_number=number,
            state=TrialState.QUEUED,
            hparams=hparams,
            slots_per_trial=slots,
        )

    def write_trial_row(self, number: int, optuna_id: int, hparams: dict[str, Any]) -> Trial:
        """Write the row of Optuna trial ``number`` in its own transaction; returns it."""
        with session_scope(self.ctx.db_url) as session:
            trial = self.new_trial_row(number, optuna_id, hparams)
            session.add(trial)
        return trial

    # ----------------------------------------------------------------- recovery
    def adopt_unwritten(self, known_numbers: set[int]) -> None:
        """Adopt the trials asked from Optuna whose row was never written (driver died in between).

        They are adopted rather than lost, if they had all their values by then.
        """
        import optuna

        for frozen in self._trials(optuna.trial.TrialState.RUNNING):
            if frozen.number not in known_numbers:
                self._adopt(frozen)

    def _adopt(self, frozen: optuna.trial.FrozenTrial) -> None:
        import optuna

        hparams = dict(frozen.params)
        for name, hp in self.ctx.config.hyperparameters.items():
            if getattr(hp, "type", None) == "const":
                hparams.setdefault(name, hp.val)  # type: ignore[union-attr]
        missing = missing_hparams(self.ctx.config, hparams)
        if missing:
            # Asked but never given all its values (a crash between ask and the
            # suggestions): running it would train with settings nobody chose.
            _log.warning(
                "trial %s has no value for %s; it is failed and replaced",
                self.ctx.label(frozen.number),
                ", ".join(missing),
            )
            self.study.tell(
                frozen.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True
            )
            return
        optuna_id = optuna_trial_id(self.ctx.db_url, self.ctx.study_name, frozen.number)
        with session_scope(self.ctx.db_url) as session:
            session.add(self.new_trial_row(frozen.number, optuna_id, hparams))

    def reconcile(self) -> None:
        """Tell Optuna outcomes that were recorded here just before a crash."""
        import optuna

        unfinished = {t.number for t in self._trials(optuna.trial.TrialState.RUNNING)}
        with session_scope(self.ctx.db_url) as session:
            for trial in session.scalars(
                select(Trial).where(
                    Trial.experiment_id == self.ctx.experiment_id,
                    Trial.optuna_trial_number.in_(unfinished),
                    Trial.state.in_([TrialState.COMPLETED, TrialState.PRUNED, TrialState.ERROR]),
                )
            ):
                self._tell_recorded(trial)

    def _tell_recorded(self, trial: Trial) -> None:
        import optuna

        if trial.state == TrialState.COMPLETED:
            self.tells.tell(trial, values=objective_values(self.ctx.config, trial))
        elif trial.state == TrialState.PRUNED:
            self.tells.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.tells.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ----------------------------------------------------------------- the end
    def completion_state(self) -> ExperimentState:
        """COMPLETED, or ERROR when trials ran and none of them succeeded."""
        with session_scope(self.ctx.db_url) as session:
            counts = trial_counts(session, self.ctx.experiment_id)
        if counts.total and not (counts.completed or counts.pruned):
            return ExperimentState.ERROR
        return ExperimentState.COMPLETED
