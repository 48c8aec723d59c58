"""The search driver: ask Optuna, place trials on slots, run them, tell Optuna.

One driver owns an experiment at a time (its heartbeat is in the experiment row).
Everything it knows is in the database, so :meth:`SearchDriver.run` serves a new
search and a resumed one alike: finished trials stay finished, interrupted trials
continue from their latest checkpoint, and the Optuna study goes on to
``max_trials``.

:class:`SearchDriver` only composes the parts and runs the tick loop; each part is
a small module found by its name:

- :mod:`searcher.driver.study_side`: the Optuna study (ask, write trial rows, tell, adopt and
  reconcile after a crash, trials left);
- :mod:`searcher.driver.placement`: the pending queue and placing it on free slots;
- :mod:`searcher.driver.running`: starting attempts through the executor, reaping, hang
  detection, preempting and killing, leftovers of a dead driver;
- :mod:`searcher.driver.handoff`: a warm job's next trials decided ahead, which the job's rank 0
  starts itself at the hand-back;
- :mod:`searcher.driver.runtime_spec`: the runtime spec of an attempt (a pure builder);
- :mod:`searcher.driver.outcomes`: what an ended attempt means (a pure decision, applied);
- :mod:`searcher.driver.control`: ownership, heartbeat, Ctrl-C and requested actions, the end;
- :mod:`searcher.driver.context`: the experiment's fixed facts the parts share.

The driver checks nothing about the run itself: it is handed a
:class:`~searcher.submit.submission.ValidatedRun` (the config, the pool, the run's one
executor, the database), validated once when the run was submitted.

A search is one call, which returns the experiment's final state
(``ExperimentState.COMPLETED`` when its trials ran); it starts every trial's
processes, so the end-to-end tests run it rather than an example here::

    SearchDriver(experiment_id, validate_run(config, load_cluster(), url)).run()
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

import searcher.driver.control as control
from searcher.driver.context import DriverContext, driver_log
from searcher.driver.control import Control, Stop
from searcher.driver.decisions import apply_decisions
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import PendingQueue
from searcher.driver.progress import SearchProgress
from searcher.driver.running import RunningTrials, end_leftover_warm_jobs, end_leftovers
from searcher.driver.study_side import StudySide, TellQueue, max_trials
from searcher.experiments import UsageError
from searcher.integrations import DriverIntegrations
from searcher.logs import experiment_log_dir
from searcher.submit.submission import ValidatedRun
from storage import (
    TRANSIENT_DEADLINE_S,
    DatabaseUnavailableError,
    Experiment,
    ExperimentState,
    Trial,
    TrialState,
    is_transient_error,
    session_scope,
)
from trials.queries import trial_counts, trial_total
from trials.timings import timings_from_env

_log = driver_log

# How often the progress bar's counts are read from the database while the search runs.
_PROGRESS_EVERY_S = 0.25


class SearchDriver:
    """Runs (or resumes) one experiment until it completes, pauses or is killed."""

    def __init__(
        self,
        experiment_id: int,
        run: ValidatedRun,
        *,
        poll_interval_s: float = 0.2,
        show_progress: bool = True,
    ) -> None:
        self.db_url = run.db_url
        self.config = run.config
        self.pool = run.pool
        self.executor = run.executor
        self.poll_interval_s = poll_interval_s
        self.show_progress = show_progress
        with session_scope(self.db_url) as session:
            experiment = session.get(Experiment, experiment_id)
            if experiment is None:
                raise UsageError(f"experiment: no experiment with id {experiment_id}")
            self.experiment_id = experiment.id
            self.study_name = experiment.study_name
            self.model_dir = Path(experiment.model_dir)
            run_dir = experiment_log_dir(experiment.id, experiment.created_at)
            checkpoint_folder = experiment.checkpoint_folder
        self.ctx = DriverContext(
            db_url=self.db_url,
            experiment_id=self.experiment_id,
            study_name=self.study_name,
            model_dir=self.model_dir,
            config=self.config,
            pool=self.pool,
            executor=self.executor,
            run_dir=run_dir,
            timings=timings_from_env(),
            checkpoint_folder=checkpoint_folder,
        )
        self._control = Control()
        self._tells = TellQueue()
        self._pending = PendingQueue(self.ctx)
        self._outcomes = Outcomes(self.ctx, self._tells, self._control)
        self._running = RunningTrials(self.ctx, self._outcomes)
        self._study: StudySide | None = None
        # MLflow and notifications: a thread of their own, fed from the database.
        self._integrations = DriverIntegrations(
            self.db_url,
            self.experiment_id,
            self.config,
            cluster_notifications=run.cluster.notifications,
        )

    # ----------------------------------------------------------------- set-up
    def _recover(self, study: StudySide) -> None:
        """Rebuild the queue from the database after a crash, pause or first start."""
        ctx = self.ctx
        with session_scope(ctx.db_url) as session:
            trials = list(
                session.scalars(
                    select(Trial)
                    .where(Trial.experiment_id == ctx.experiment_id)
                    .order_by(Trial.id)
                )
            )
            known_numbers = {t.optuna_trial_number for t in trials}
            # A warm job's slots outlive its trials: it ends (and frees them) first.
            end_leftover_warm_jobs(ctx, session)
            for trial in trials:
                end_leftovers(ctx, session, trial)
        # Trials asked from Optuna whose row was never written (driver died in between)
        # are adopted rather than lost, if they had all their values by then.
        study.adopt_unwritten(known_numbers)
        with session_scope(ctx.db_url) as session:
            for trial in session.scalars(
                select(Trial)
                .where(Trial.experiment_id == ctx.experiment_id)
                .where(Trial.state.in_([TrialState.QUEUED, TrialState.RUNNING]))
                .order_by(Trial.id)
            ):
                if trial.finished_at or trial.pruned_at:
                    # It finished while no driver was watching: only Optuna is not told.
                    apply_decisions(
                        self._outcomes.finalize(session, trial, exit_code=None),
                        self._pending,
                        self._control,
                    )
                    continue
                trial.state = TrialState.QUEUED
                self._pending.queue(trial)
        study.reconcile()
        study.flush_tells()

    # ----------------------------------------------------------------- main loop
    def run(self) -> ExperimentState:
        """Drive the search to its end; returns the experiment's final state."""
        control.claim_ownership(self.ctx)
        with session_scope(self.db_url) as session:
            trials_so_far = trial_total(session, self.experiment_id)
        self._study = StudySide.load(self.ctx, trials_so_far, self._tells)
        self._recover(self._study)
        # Ending a dead driver's leftovers may take longer than the lease: that old
        # heartbeat is no sign of this driver having been stopped (nothing of it runs yet).
        control.heartbeat(self.ctx, self._control)
        progress = SearchProgress(
            total=max_trials(self.config),
            enabled=self.show_progress,
            metric=self.config.searcher.metric,
        )
        control.install_signal_handlers(self._control)
        self._integrations.start()
        final: ExperimentState | None = None
        self._last_heartbeat = 0.0
        self._last_progress = 0.0
        outage_since: float | None = None
        try:
            with progress:
                while final is None:
                    try:
                        final = self._tick(progress)
                        outage_since = None
                    except Exception as exc:
                        # A database restart (PostgreSQL) or a writer holding SQLite past
                        # the busy timeout: keep the trials running and try again; every
                        # tick's writes are whole transactions, so a failed one left
                        # nothing half-done.
                        if not is_transient_error(exc):
                            raise
                        now = time.monotonic()
                        if outage_since is None:
                            outage_since = now
                            _log.warning("the database is unreachable; retrying: %s", exc)
                        elif now - outage_since > TRANSIENT_DEADLINE_S:
                            raise DatabaseUnavailableError(
                                f"the database was unreachable for {TRANSIENT_DEADLINE_S:g} s"
                            ) from exc
                        time.sleep(1.0)
                        continue
                    if final is None:
                        self._running.wait(self.poll_interval_s)
                self._refresh_progress(progress, final=True)
        except control.DriverReplacedError:
            # Another driver owns the experiment now, and with it these trials: it ended
            # what this one left running before it took over. Nothing here is ours to end.
            self._integrations.close()
            raise
        except BaseException as exc:
            self._kill_running()
            self._finish(ExperimentState.PAUSED)
            self._integrations.search_ended(
                ExperimentState.PAUSED.value,
                "interrupted (Ctrl-C)"
                if isinstance(exc, KeyboardInterrupt)
                else f"the driver stopped: {type(exc).__name__}: {exc}",
            )
            self._integrations.close()
            raise
        finally:
            control.restore_signal_handlers(self._control)
        self._finish(final)
        self._integrations.search_ended(final.value, self._end_reason(final))
        self._integrations.close()
        return final

    def _end_reason(self, state: ExperimentState) -> str:
        """The one line a notification gives for how the search ended."""
        if state == ExperimentState.ERROR:
            return self._control.stop_reason or "the search stopped with an error"
        if state == ExperimentState.PAUSED:
            return "paused (slotsweep pause, the UI, or Ctrl-C); resume with slotsweep resume"
        if state == ExperimentState.CANCELED:
            return "killed"
        with session_scope(self.db_url) as session:
            counts = trial_counts(session, self.experiment_id)
        return (
            f"{counts.total} trials: {counts.completed} completed, {counts.pruned} pruned, "
            f"{counts.errored} failed"
        )

    def _tick(self, progress: SearchProgress) -> ExperimentState | None:
        """One round of the loop; the experiment's final state once it ends, else None.

        The round is a pipeline: reap the ended attempts (their outcomes recorded),
        apply what those decided (requeue, stop), then place the waiting trials, launch
        what the placement gave slots, and apply what the launches decided (a trial
        that started nothing waits again). Optuna hears the outcomes, and the trials
        to come are asked ahead, only once the launches are done and the warm jobs'
        ranks took the trials handed to them: a warm job's next trials, asked while its
        current one ran, are decided ahead as that job's next (:mod:`searcher.driver.handoff`),
        and its rank 0 starts each at a hand-back without waiting for this driver.
        """
        study = self._loaded_study()
        self._keep_lease()
        apply_decisions(self._running.reap(), self._pending, self._control)
        if self._control.action in (Stop.KILL, Stop.ERROR):
            self._kill_running()
            return (
                ExperimentState.CANCELED
                if self._control.action == Stop.KILL
                else ExperimentState.ERROR
            )
        if self._control.action == Stop.PAUSE:
            self._running.preempt()
            study.flush_tells()
            if not self._running and not self._running.has_warm_jobs:
                return ExperimentState.PAUSED
        else:
            # Only what the free room needs now: nothing when a trial was asked ahead (a
            # trial decided ahead for a warm job counts as asked ahead).
            asked_ahead = len(self._running.ahead)
            study.fill_queue(len(self._running) + asked_ahead, self._pending)
            limit = self.config.searcher.max_concurrent_trials
            placed = self._pending.place(room=max(0, limit - len(self._running)))
            apply_decisions(self._running.launch(placed), self._pending, self._control)
            # Optuna's writes queue behind a warm job's ranks taking their next trial, and
            # behind the next hand-over when another warm job handed its trial back meanwhile.
            if not self._running.warm.await_taken():
                study.flush_tells()
                self._ask_ahead(study)
            # An idle job that no waiting trial fits takes a busy job's second trial
            # decided ahead, if one of its size has two, rather than end meanwhile.
            idle_sizes = [
                idle.slots for idle in self._running.warm.unneeded(self._pending.sizes())
            ]
            apply_decisions(self._running.ahead.share(idle_sizes), self._pending, self._control)
            self._running.warm.end_unneeded(self._pending.sizes())
            if (
                not self._running
                and not self._pending
                and not self._running.has_warm_jobs
                and study.search_done()
            ):
                return study.completion_state()
        self._refresh_progress(progress)
        return None

    def _ask_ahead(self, study: StudySide) -> None:
        """Ask and decide ahead the next trials of each warm job at work, one at a time.

        Asked off the hand-over's path and decided ahead as the job's next: its rank 0
        starts them at hand-backs. Each is decided as soon as it is asked (a job with none
        decided first), and the asking stops at a hand-back this driver has not seen: an
        ask takes tens of milliseconds, and a job handed back idle waits for the driver.
        """
        while True:
            asked = study.fill_queue(
                len(self._running) + len(self._running.ahead),
                self._pending,
                ahead=self._running.wanted_ahead,
                most=1,
            )
            self._running.reserve_ahead(self._pending)
            if not asked or self._running.warm_handed_back():
                return

    def _keep_lease(self) -> None:
        """Heartbeat every ``heartbeat_every_s``; then check claims if it was stopped, end hangs."""
        now = time.monotonic()
        if now - self._last_heartbeat < self.ctx.timings.heartbeat_every_s:
            return
        stale_s = control.heartbeat(self.ctx, self._control)
        if stale_s is not None:
            # This driver was stopped for longer than its lease: other drivers may
            # have reclaimed its slots meanwhile. Its claims and runs come first.
            _log.warning(
                "this driver's heartbeat was %.0f s old (was it stopped?), past its "
                "%g s lease; checking its claims and runs",
                stale_s,
                self.ctx.timings.lease_s,
            )
            self._running.revalidate()
        self._running.end_hung()
        self._last_heartbeat = now

    def _loaded_study(self) -> StudySide:
        assert self._study is not None
        return self._study

    def _kill_running(self) -> None:
        """End every running trial's processes; requeue them, or fail them on kill."""
        self._running.kill(self._control)
        self._loaded_study().flush_tells()

    def _finish(self, state: ExperimentState) -> None:
        control.finish(self.ctx, state, self._control, self._outcomes.fail, self._outcomes.not_run)
        self._loaded_study().flush_tells()

    def _refresh_progress(self, progress: SearchProgress, *, final: bool = False) -> None:
        """Show the trials' counts and the best value (two queries): at the end, and at most
        every ``_PROGRESS_EVERY_S`` while the search runs, not at every tick of a few
        milliseconds; never when the progress bar is off."""
        now = time.monotonic()
        if not progress.enabled or (not final and now - self._last_progress < _PROGRESS_EVERY_S):
            return
        self._last_progress = now
        with session_scope(self.db_url) as session:
            counts = trial_counts(session, self.experiment_id)
            best = session.execute(
                select(Trial.searcher_metric_value)
                .where(
                    Trial.experiment_id == self.experiment_id,
                    Trial.state == TrialState.COMPLETED,
                    Trial.searcher_metric_value.is_not(None),
                )
                .order_by(
                    Trial.searcher_metric_value.asc()
                    if self.config.searcher.smaller_is_better
                    else Trial.searcher_metric_value.desc()
                )
                .limit(1)
            ).scalar()
        progress.update(counts, best)
