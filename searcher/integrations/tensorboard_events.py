"""An experiment as TensorBoard event files, written from the database and appended to.

One run per trial (``trial-<number>``): its training and validation metrics at their
steps (``training/loss``, ``validation/val_loss``), its phase timings
(``timings/<phase>_s``, the window's mean, at the window's last step) and its system
samples (``system/<agent>[/gpu<i>]/<name>``, at seconds into the trial) as scalars, and
its hyperparameters and final status for TensorBoard's HParams plugin; the logdir's own
run holds the HParams experiment (the hyperparameters and the searcher metric).

Each :meth:`TensorBoardExport.write` adds only what the database gained since the last
one: the last row exported of each trial is kept in ``.slotsweep-export.json`` in the
logdir, and new events go to new event files (TensorBoard reads every file of a run),
so a running search's logdir grows without anything written being rewritten. The
writer is TensorBoard's own (``tensorboard`` is the ``slotsweep[tensorboard]`` extra).

Example:
    >>> export = TensorBoardExport(url, 1, folder / "tb")
    >>> export.write() >= 0, sorted(p.name for p in (folder / "tb").iterdir())[:1]
    (True, ['.slotsweep-export.json'])
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from searcher.experiments import UsageError
from searcher.integrations.extras import require
from searcher.integrations.records import (
    ExperimentRecord,
    Point,
    TrialRecord,
    metric_points,
    read_experiment,
    system_points,
    timing_points,
)
from storage import TrialState, session_scope

STATE_FILE = ".slotsweep-export.json"
_SERIES = ("metrics", "timings", "system")


def run_name(number: int) -> str:
    """The TensorBoard run of trial ``number``.

    Example:
        >>> run_name(3)
        'trial-3'
    """
    return f"trial-{number}"


class TensorBoardExport:
    """Writes one experiment into ``logdir`` and appends to it on each :meth:`write`.

    Event files stay open between writes (one per run for this object's life) and are
    flushed at the end of each; :meth:`close` closes them.
    """

    def __init__(self, db_url: str, experiment_id: int, logdir: Path) -> None:
        require("tensorboard", extra="tensorboard")
        self.db_url = db_url
        self.experiment_id = experiment_id
        self.logdir = logdir
        self._writers: dict[str, Any] = {}
        self._state = self._load_state()

    def write(self) -> int:
        """Export what the database gained since the last write; the number of values written."""
        pending: list[tuple[TrialRecord, dict[str, list[Point]]]] = []
        with session_scope(self.db_url) as session:
            experiment = read_experiment(session, self.experiment_id)
            for trial in experiment.trials:
                done = self._trial_state(trial.id)
                pending.append(
                    (
                        trial,
                        {
                            "metrics": metric_points(session, trial.id, done["metrics"]),
                            "timings": timing_points(session, trial.id, done["timings"]),
                            "system": system_points(
                                session, trial.id, done["system"], trial.started_at
                            ),
                        },
                    )
                )
        written = 0
        if not self._state["experiment_written"]:
            self._add("", _hparams_experiment(experiment), experiment.created_at)
            self._state["experiment_written"] = True
        for trial, series in pending:
            written += self._write_trial(trial, series)
        for writer in self._writers.values():
            writer.flush()
        # Saved after the events are on disk: a crash in between re-exports a page at
        # worst, never loses one.
        self._save_state()
        return written

    def close(self) -> None:
        """Close the event files (:meth:`write` reopens new ones)."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    # ------------------------------------------------------------------ private
    def _write_trial(self, trial: TrialRecord, series: dict[str, list[Point]]) -> int:
        done = self._trial_state(trial.id)
        run = run_name(trial.number)
        if not done["started"] and trial.started_at is not None:
            self._add(run, _session_start(trial), trial.started_at)
            done["started"] = True
        written = 0
        for name in _SERIES:
            points = series[name]
            for point in points:
                value = math.nan if point.value is None else float(point.value)
                self._add(run, _scalar(point.tag, value), point.wall_time, point.step)
            if points:
                done[name] = points[-1].id
                written += len(points)
        if done["started"] and not done["ended"] and trial.state.is_terminal:
            self._add(run, _session_end(trial), trial.ended_at or time.time())
            done["ended"] = True
        return written

    def _add(self, run: str, summary: Any, wall_time: float, step: int = 0) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writer = self._writers.get(run)
        if writer is None:
            folder = self.logdir / run if run else self.logdir
            folder.mkdir(parents=True, exist_ok=True)
            writer = self._writers[run] = EventFileWriter(str(folder))
        writer.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def _trial_state(self, trial_id: int) -> dict[str, Any]:
        trials: dict[str, dict[str, Any]] = self._state["trials"]
        return trials.setdefault(
            str(trial_id), {**dict.fromkeys(_SERIES, 0), "started": False, "ended": False}
        )

    def _load_state(self) -> dict[str, Any]:
        path = self.logdir / STATE_FILE
        fresh = {"experiment_id": self.experiment_id, "experiment_written": False, "trials": {}}
        if not path.is_file():
            return fresh
        state: dict[str, Any] = json.loads(path.read_text())
        if state.get("experiment_id") != self.experiment_id:
            raise UsageError(
                f"--logdir: {self.logdir} holds experiment {state.get('experiment_id')}'s "
                f"event files; give experiment {self.experiment_id} a folder of its own"
            )
        return state

    def _save_state(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        path = self.logdir / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._state))
        temporary.replace(path)


def _scalar(tag: str, value: float) -> Any:
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def _hparam_value(value: Any) -> bool | int | float | str:
    """A hyperparameter as the HParams plugin takes it (a const list or mapping as JSON)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def _hparams_experiment(experiment: ExperimentRecord) -> Any:
    from tensorboard.plugins.hparams import summary_v2

    return summary_v2.hparams_config_pb(
        hparams=[summary_v2.HParam(name) for name in experiment.hyperparameters],
        metrics=[summary_v2.Metric(f"validation/{experiment.metric}")],
        time_created_secs=experiment.created_at,
    )


def _session_start(trial: TrialRecord) -> Any:
    from tensorboard.plugins.hparams import summary_v2

    hparams = {name: _hparam_value(v) for name, v in trial.hyperparameters.items()}
    return summary_v2.hparams_pb(hparams, trial_id=trial.label, start_time_secs=trial.started_at)


def _session_end(trial: TrialRecord) -> Any:
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    status = api_pb2.STATUS_FAILURE if trial.state == TrialState.ERROR else api_pb2.STATUS_SUCCESS
    data = plugin_data_pb2.HParamsPluginData(
        session_end_info=plugin_data_pb2.SessionEndInfo(
            status=status, end_time_secs=trial.ended_at or time.time()
        )
    )
    return summary_pb2.Summary(
        value=[
            summary_pb2.Summary.Value(
                tag=metadata.SESSION_END_INFO_TAG,
                metadata=metadata.create_summary_metadata(data),
                tensor=metadata.NULL_TENSOR,
            )
        ]
    )
