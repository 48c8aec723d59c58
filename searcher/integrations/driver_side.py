"""What the search driver runs beside its tick: MLflow logging and webhook notifications.

The driver builds one :class:`DriverIntegrations` and calls :meth:`~DriverIntegrations.start`,
:meth:`~DriverIntegrations.search_ended` and :meth:`~DriverIntegrations.close`; none of
them waits on a tracking server or a webhook. A thread of its own reads the database
every :data:`POLL_S` seconds: trials newly failed (``trial_failed``), and, with
``integrations.mlflow``, what MLflow has not been given yet
(:class:`~searcher.integrations.mlflow_runs.MlflowExport`). A tracking server that is
slow or down only delays that thread: it is retried with backoff, logged once until
it answers again, and caught up from the database when it does. When the search ends,
the driver gives the thread at most ``close``'s timeout to log the end and post the
notifications; what MLflow still lacks then, ``slotsweep export mlflow`` adds.

Without ``integrations`` and ``notifications`` nothing starts.

Example:
    >>> integrations = DriverIntegrations(url, 1, config, cluster_notifications=())
    >>> integrations.active
    False
    >>> integrations.start(); integrations.search_ended("COMPLETED", "done")
    >>> integrations.close(timeout=1.0)
    True
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from searcher.integrations.mlflow_runs import MlflowExport
from searcher.integrations.notifications import Poster, notification_body
from searcher.integrations.records import ExperimentRecord, read_experiment
from storage import TrialState, session_scope
from trials.config import ExperimentConfig, NotificationConfig

_log = logging.getLogger("searcher.driver")

#: Seconds between the thread's reads of the database.
POLL_S = 2.0
#: The longest wait between two tries of an unreachable tracking server.
MAX_BACKOFF_S = 60.0
#: How long the driver waits, at the search's end, for MLflow and the notifications.
CLOSE_TIMEOUT_S = 15.0
_END_EVENTS = {"COMPLETED": "completed", "ERROR": "error", "PAUSED": "paused"}


class DriverIntegrations:
    """The integrations of one experiment's driver; see the module doc."""

    def __init__(
        self,
        db_url: str,
        experiment_id: int,
        config: ExperimentConfig,
        *,
        cluster_notifications: Iterable[NotificationConfig],
    ) -> None:
        self.db_url = db_url
        self.experiment_id = experiment_id
        targets: dict[str, NotificationConfig] = {}
        for target in (*config.notifications, *cluster_notifications):
            targets.setdefault(target.url, target)  # one post per URL, the config's first
        self._targets = tuple(targets.values())
        mlflow = config.integrations.mlflow
        self._mlflow = (
            MlflowExport(
                db_url,
                experiment_id,
                tracking_uri=mlflow.tracking_uri,
                experiment_name=mlflow.experiment_name,
            )
            if mlflow is not None
            else None
        )
        self._poster: Poster | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ended: tuple[str, str] | None = None
        self._known_failed: set[int] | None = None
        self._mlflow_failing = False
        self._mlflow_next_at = 0.0
        self._mlflow_backoff_s = POLL_S
        self._mlflow_caught_up = False
        self._step_failing = False

    @property
    def active(self) -> bool:
        """Whether anything is configured (else no thread starts)."""
        return bool(self._targets) or self._mlflow is not None

    def start(self) -> None:
        """Start the background thread (nothing when nothing is configured)."""
        if not self.active or self._thread is not None:
            return
        if self._targets:
            self._poster = Poster()
        self._thread = threading.Thread(
            target=self._run, name="slotsweep-integrations", daemon=True
        )
        self._thread.start()

    def search_ended(self, state: str, reason: str) -> None:
        """Record how the search ended (an ``ExperimentState`` value); the thread reports it."""
        self._ended = (state, reason)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Give the thread at most ``timeout`` s to finish; whether everything was sent."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        done = not self._thread.is_alive() and (self._mlflow is None or self._mlflow_caught_up)
        if self._poster is not None:
            done = self._poster.close(max(0.0, deadline - time.monotonic())) and done
        if not done and self._mlflow is not None:
            _log.warning(
                "MLflow may lack the end of this search; `slotsweep export mlflow %d "
                "--tracking-uri %s` adds what is missing",
                self.experiment_id,
                self._mlflow.tracking_uri,
            )
        return done

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(POLL_S)
            try:
                self._step(final=stopping)
            except Exception as exc:  # the database, transiently: the next step retries
                if not self._step_failing:
                    self._step_failing = True
                    _log.warning("integrations: %s; retrying", _first_line(exc))
            else:
                self._step_failing = False
            if stopping:
                return

    def _step(self, *, final: bool) -> None:
        with session_scope(self.db_url) as session:
            experiment = read_experiment(session, self.experiment_id)
        if self._poster is not None:
            self._notify_failed_trials(experiment)
            if final and self._ended is not None:
                self._notify_end(experiment, *self._ended)
        if self._mlflow is not None and (final or time.monotonic() >= self._mlflow_next_at):
            self._sync_mlflow(final=final)

    def _notify_failed_trials(self, experiment: ExperimentRecord) -> None:
        failed = {t.id: t for t in experiment.trials if t.state == TrialState.ERROR}
        if self._known_failed is None:
            # Trials that failed before this driver started were notified by the one then.
            self._known_failed = set(failed)
            return
        for trial_id in sorted(set(failed) - self._known_failed):
            trial = failed[trial_id]
            self._send(
                experiment,
                "trial_failed",
                trial.failure_reason or "the trial failed",
                trial=trial.label,
            )
            self._known_failed.add(trial_id)

    def _notify_end(self, experiment: ExperimentRecord, state: str, reason: str) -> None:
        event = _END_EVENTS.get(state)
        if event is not None:
            self._send(experiment, event, reason)

    def _send(
        self, experiment: ExperimentRecord, event: str, reason: str, trial: str | None = None
    ) -> None:
        assert self._poster is not None
        body = notification_body(
            experiment_id=experiment.id,
            name=experiment.name,
            event=event,
            state=experiment.state,
            counts=experiment.counts,
            metric=experiment.metric,
            best_value=experiment.best_value,
            reason=reason,
            trial=trial,
        )
        for target in self._targets:
            if event in target.on:
                self._poster.send(target, body)

    def _sync_mlflow(self, *, final: bool) -> None:
        assert self._mlflow is not None
        try:
            # At the end, on until everything is logged (close() bounds the wait); a new
            # trial's run is made by one sync and given its metrics by the next.
            caught_up = self._mlflow.sync()
            while not caught_up and final and self._mlflow.changed:
                caught_up = self._mlflow.sync()
        except Exception as exc:  # whatever the client raises: the server is retried
            self._mlflow_backoff_s = min(self._mlflow_backoff_s * 2, MAX_BACKOFF_S)
            self._mlflow_next_at = time.monotonic() + self._mlflow_backoff_s
            if not self._mlflow_failing:
                self._mlflow_failing = True
                _log.warning(
                    "MLflow at %s: %s; retrying in the background (logged once until it answers)",
                    self._mlflow.tracking_uri,
                    _first_line(exc),
                )
            return
        self._mlflow_caught_up = caught_up
        if self._mlflow_failing:
            self._mlflow_failing = False
            _log.warning("MLflow at %s answers again; catching up", self._mlflow.tracking_uri)
        self._mlflow_backoff_s = POLL_S
        self._mlflow_next_at = 0.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
