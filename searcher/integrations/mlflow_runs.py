"""An experiment as MLflow runs: one parent run for the search, one nested run per trial.

Written from the database, never from the ranks: the driver's background logger
(:class:`searcher.integrations.DriverIntegrations`) calls :meth:`MlflowExport.sync`
every few seconds, and ``slotsweep export mlflow`` calls it once for a finished
search. Each trial's run gets its hyperparameters as params, its metrics at their
steps (``training/loss``, ``validation/val_loss``), its final state and failure
reason as tags and its status, and a link back (``slotsweep describe`` and the UI's
page). A sync adds only what is missing: the runs are found again by their
``slotsweep.*`` tags and the last metric row logged is kept on each run
(``slotsweep.metrics_through``), so a driver restarted later, or an export after a
driver that could not reach the server, catches up without logging a value twice.

``mlflow`` is the ``slotsweep[mlflow]`` extra (MLflow's client, ``mlflow-skinny``).

Example (talks to a tracking server, so tests/searcher/integrations/test_integrations.py runs it)::

    MlflowExport(db_url, 3, tracking_uri="http://127.0.0.1:5000").sync()
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

from searcher.integrations.extras import ensure_installed
from searcher.integrations.records import (
    PAGE_ROWS,
    ExperimentRecord,
    Point,
    TrialRecord,
    metric_points,
    read_experiment,
)
from storage import TrialState, redact_url, session_scope

_log = logging.getLogger(__name__)

# MLflow's limit on the metrics of one log_batch call.
BATCH_METRICS = 1000
# A parameter value longer than MLflow's limit (6000 characters) is cut to it.
MAX_PARAM_CHARS = 6000
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_TAG_SEARCH = "slotsweep.search"
_TAG_TRIAL = "slotsweep.trial_id"
_TAG_THROUGH = "slotsweep.metrics_through"
_TERMINAL_STATUS = {
    TrialState.COMPLETED: "FINISHED",
    TrialState.PRUNED: "FINISHED",
    TrialState.ERROR: "FAILED",
    TrialState.NOT_RUN: "KILLED",
}
_SEARCH_STATUS = {"COMPLETED": "FINISHED", "ERROR": "FAILED", "CANCELED": "KILLED"}


def search_key(db_url: str, experiment_id: int) -> str:
    """What tags a search's runs: the experiment id and which database it lives in.

    A hash of the URL, not the URL: the tag is stored on the tracking server, and a
    database URL may hold a password.

    Example:
        >>> search_key("sqlite:///a.db", 3) == search_key("sqlite:///a.db", 3)
        True
        >>> search_key("sqlite:///a.db", 3).endswith(":3")
        True
    """
    digest = hashlib.sha256(db_url.encode()).hexdigest()[:16]
    return f"{digest}:{experiment_id}"


class MlflowExport:
    """Keeps one experiment's MLflow runs up to date with its database; see the module doc."""

    def __init__(
        self,
        db_url: str,
        experiment_id: int,
        *,
        tracking_uri: str,
        experiment_name: str | None = None,
    ) -> None:
        ensure_installed("mlflow", extra="mlflow")
        # MLflow's client prints each ended run's URL to stdout, the driver's summary.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        # Its own retries (7, over minutes) would hold a failed sync that long: slotsweep
        # retries a whole sync itself, so a request gives up sooner (unless the user says).
        for name, value in _CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.db_url = db_url
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self._key = search_key(db_url, experiment_id)
        self._client: Any = None
        self._mlflow_experiment: str | None = None
        self._parent: str | None = None
        self._parent_done = False
        #: trial id -> [MLflow run id, last metric row logged, run ended].
        self._runs: dict[int, list[Any]] = {}
        #: Whether the last :meth:`sync` logged anything (a run, metrics, an end).
        self.changed = False

    def sync(self) -> bool:
        """Log what the database gained since the last sync; whether MLflow has it all now.

        All: every metric recorded so far, every ended trial's end, and the search's
        end once it ended (a paused search's trials stay RUNNING there, as here).

        Raises whatever the tracking server's client raises (unreachable, refused): the
        caller retries, and the next sync starts where this one stopped.
        """
        with session_scope(self.db_url) as session:
            experiment = read_experiment(session, self.experiment_id)
        self._connect(experiment)  # no database transaction held while MLflow answers
        with session_scope(self.db_url) as session:
            pages = {
                t.id: metric_points(session, t.id, self._runs[t.id][1])
                for t in experiment.trials
                if t.id in self._runs and not self._runs[t.id][2]
            }
        caught_up = True
        self.changed = False
        for trial in experiment.trials:
            if trial.id not in self._runs:
                if trial.started_at is None and not trial.state.is_terminal:
                    continue  # queued: no run until it starts
                self._start_trial(trial)
                caught_up = False  # its metrics are read on the next sync
                self.changed = True
                continue
            entry = self._runs[trial.id]
            if entry[2]:
                continue
            points = pages.get(trial.id, [])
            if points:
                self._log_metrics(entry, points)
                self.changed = True
            if len(points) >= PAGE_ROWS:
                caught_up = False
            elif trial.state.is_terminal:
                self._end_trial(entry, trial)
                self.changed = True
        if caught_up and experiment.state in _SEARCH_STATUS and not self._parent_done:
            self._end_search(experiment)
            self.changed = True
        return caught_up and (self._parent_done or experiment.state not in _SEARCH_STATUS)

    # ------------------------------------------------------------------ private
    def _connect(self, experiment: ExperimentRecord) -> None:
        """The client, the MLflow experiment, the parent run and the trials' runs found again."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        client = self._client
        if self._mlflow_experiment is None:
            name = self.experiment_name or experiment.name
            found = client.get_experiment_by_name(name)
            self._mlflow_experiment = (
                found.experiment_id if found is not None else client.create_experiment(name)
            )
        if self._parent is None:
            runs = client.search_runs(
                [self._mlflow_experiment],
                filter_string=f"tags.`{_TAG_SEARCH}` = '{self._key}'",
                max_results=50_000,
            )
            for run in runs:
                tags = run.data.tags
                if _TAG_TRIAL not in tags:
                    self._parent = run.info.run_id
                    self._parent_done = run.info.status != "RUNNING"
                    continue
                self._runs[int(tags[_TAG_TRIAL])] = [
                    run.info.run_id,
                    int(tags.get(_TAG_THROUGH, "0")),
                    run.info.status != "RUNNING",
                ]
            if self._parent is None:
                self._parent = client.create_run(
                    self._mlflow_experiment,
                    start_time=int(experiment.created_at * 1000),
                    tags={
                        _TAG_SEARCH: self._key,
                        "slotsweep.experiment_id": str(experiment.id),
                        "slotsweep.database": redact_url(self.db_url),
                        "mlflow.note.content": _link(self.db_url, experiment.id, None),
                    },
                    run_name=f"{experiment.name} (slotsweep {experiment.id})",
                ).info.run_id

    def _start_trial(self, trial: TrialRecord) -> None:
        from mlflow.entities import Param

        run = self._client.create_run(
            self._mlflow_experiment,
            start_time=int((trial.started_at or time.time()) * 1000),
            tags={
                "mlflow.parentRunId": self._parent,
                _TAG_SEARCH: self._key,
                _TAG_TRIAL: str(trial.id),
                "slotsweep.trial": trial.label,
                "slotsweep.state": trial.state.value,
                "mlflow.note.content": _link(self.db_url, self.experiment_id, trial.label),
            },
            run_name=f"trial {trial.label}",
        )
        params = [
            Param(name, str(value)[:MAX_PARAM_CHARS])
            for name, value in sorted(trial.hyperparameters.items())
        ]
        if params:
            self._client.log_batch(run.info.run_id, params=params)
        self._runs[trial.id] = [run.info.run_id, 0, False]

    def _log_metrics(self, entry: list[Any], points: list[Point]) -> None:
        from mlflow.entities import Metric

        for start in range(0, len(points), BATCH_METRICS):
            batch = points[start : start + BATCH_METRICS]
            self._client.log_batch(
                entry[0],
                metrics=[
                    Metric(
                        p.tag,
                        float("nan") if p.value is None else float(p.value),
                        int(p.wall_time * 1000),
                        p.step,
                    )
                    for p in batch
                ],
            )
            # Kept on the run, so a later driver or export resumes after this row.
            entry[1] = batch[-1].id
            self._client.set_tag(entry[0], _TAG_THROUGH, str(entry[1]))

    def _end_trial(self, entry: list[Any], trial: TrialRecord) -> None:
        client = self._client
        client.set_tag(entry[0], "slotsweep.state", trial.state.value)
        if trial.failure_reason:
            client.set_tag(entry[0], "slotsweep.failure_reason", trial.failure_reason[:5000])
        client.set_terminated(
            entry[0],
            status=_TERMINAL_STATUS[trial.state],
            end_time=int((trial.ended_at or time.time()) * 1000),
        )
        entry[2] = True

    def _end_search(self, experiment: ExperimentRecord) -> None:
        client = self._client
        client.set_tag(self._parent, "slotsweep.state", experiment.state)
        if experiment.best_value is not None:
            client.log_metric(self._parent, f"best/{experiment.metric}", experiment.best_value)
        client.set_terminated(self._parent, status=_SEARCH_STATUS[experiment.state])
        self._parent_done = True


def _link(db_url: str, experiment_id: int, trial: str | None) -> str:
    """Where the search or trial is in slotsweep: the command and the UI's page."""
    database = redact_url(db_url)
    if trial is None:
        return (
            f"slotsweep experiment {experiment_id}: `slotsweep describe {experiment_id} "
            f"--db {database}`; in `slotsweep ui`: experiment?experiment={experiment_id}"
        )
    return (
        f"slotsweep trial {trial}: `slotsweep describe {experiment_id} --db {database}`; "
        f"in `slotsweep ui`: trial?trial={trial}"
    )
