"""slotsweep from Python: start, watch, steer and read a search (what the CLI itself calls).

``slotsweep run``, ``resume`` and ``continue`` are :func:`run`, :func:`resume` and
:func:`continue_search` here, so a search started from a notebook is the same search as
one started from a terminal: the same validation (:mod:`searcher.submit.submission`), the same
:class:`~searcher.driver.driver.SearchDriver`, the same database, listed by ``slotsweep list``
and shown in the UI. An :class:`Experiment` is a handle on one experiment's row: every
property reads the database afresh, so another process (a second notebook, a terminal)
can watch a search through :meth:`Experiment.open`.

- Foreground (``detach=False``): the driver runs in this process until the search
  completes, pauses or is killed; Ctrl-C (a notebook's interrupt) pauses it as in the
  terminal, a second Ctrl-C stops it at once.
- Background (``detach=True``): ``slotsweep resume`` runs the driver in its own process
  (its own session, so closing the notebook does not end it); :meth:`Experiment.wait`
  blocks until it ends, and Ctrl-C there asks the search to pause.

A bad config raises :class:`~trials.config.ConfigError` listing every problem, and
nothing is written. The trial class is named by the config's ``entrypoint``
(``module:Class``), imported by every rank from the model directory; a mapping may give
the class itself when it lives in an importable file. A class defined in a notebook or
in a script's ``__main__`` is refused (the ranks are other processes and cannot import
it by name): move it into a file.

Example:
    >>> import searcher.api as api
    >>> try:
    ...     api.run({"name": "x", "entrypoint": "model:Trial"}, db="sqlite://")
    ... except api.ConfigError as error:
    ...     print(*error.problems, sep="\\n")
    hyperparameters: required field is missing
    searcher: required field is missing

A search, end to end (it starts torchrun processes, so tests/searcher/test_api.py runs
it rather than this docstring)::

    experiment = api.run("examples/digits/experiment.yaml", db="sqlite:///search.db")
    experiment.trials()              # a DataFrame, one row per trial
    experiment.best_trial.hyperparameters
    state = experiment.load_checkpoint()  # the best trial's newest: state["models"][0]
"""

from __future__ import annotations

import datetime as _dt
import numbers
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

import searcher.submit.samplers as samplers
from searcher.driver.control import CtrlC
from searcher.driver.driver import SearchDriver
from searcher.experiments import UsageError, find_experiment, request_action
from searcher.logs import stored_experiment_log_dir
from searcher.submit.creation import create_experiment, extend_experiment
from searcher.submit.relocation import Relocation, relocate_experiment
from searcher.submit.submission import (
    ValidatedRun,
    open_database,
    validate_new_run,
    validate_stored_run,
)
from storage import (
    DB_ENV_VAR,
    DatabaseUrlError,
    ExperimentState,
    optuna_storage,
    session_scope,
)
from storage import Experiment as ExperimentRow
from trials import queries
from trials.config import ConfigError, is_url, read_stored_config
from trials.coordination.control import Action, driver_alive
from trials.labels import parse_trial_label, trial_label
from trials.scheduler import ClusterConfigError, UnknownPool, Unschedulable

if TYPE_CHECKING:
    import optuna
    import pandas as pd

__all__ = [
    "ConfigError",
    "Experiment",
    "TrialRef",
    "TrialSummary",
    "continue_search",
    "resume",
    "run",
    "submit",
]

# How often wait() reads the experiment's state: a search's steps take seconds.
POLL_S = 0.5
# A driver started a moment ago has not yet claimed the experiment (Python and torch load
# first): wait() gives one this long before it calls the experiment driverless.
DRIVER_START_GRACE_S = 60.0
# slotsweep's packages, importable by a background driver from a source checkout too.
_PACKAGES_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TrialSummary:
    """One trial as :meth:`Experiment.trials` lists it (numbered as Optuna numbers it).

    Every :class:`Experiment` method that takes a trial takes one of these too.

    Example:
        >>> TrialSummary(3, "COMPLETED", 0.25, {"lr": 0.1}, 12.5, 0, None, experiment_id=2).label
        '2.3'
    """

    number: int
    state: str
    #: The searcher metric's final value (None until the trial completes).
    searcher_metric: float | None
    hyperparameters: dict[str, Any]
    #: Slots held times seconds, over every attempt.
    slot_seconds: float
    restarts: int
    #: Why the trial failed (None unless its state is ERROR).
    failure_reason: str | None
    #: The experiment it belongs to.
    experiment_id: int

    @property
    def label(self) -> str:
        """How the CLI, the UI and the logs name it where experiments mix: ``2.3``."""
        return trial_label(self.experiment_id, self.number)


#: A trial, as :class:`Experiment`'s methods take one: its number (``3``), its label
#: (``"#3"``, or ``"2.3"`` within experiment 2), or the :class:`TrialSummary` of it.
TrialRef = int | str | TrialSummary

# Trial numbers are stored in 32-bit columns: a larger int names no trial.
_MAX_NUMBER = 2**31 - 1


class Experiment:
    """A handle on one recorded experiment; every property reads the database afresh.

    Made by :func:`run` (and :func:`submit`) or :meth:`open`; several handles, in
    several processes, may watch one experiment.

    Example:
        >>> import searcher.api as api
        >>> experiment = api.Experiment.open("digits-large-batch", db=url)
        >>> experiment.id, experiment.state.value
        (1, 'ACTIVE')
        >>> experiment.trials()[["number", "state", "searcher_metric", "restarts"]]
           number   state searcher_metric  restarts
        0       0  QUEUED            None         0
        >>> experiment.best_trial is None, experiment.study.study_name
        (True, 'digits-large-batch-1')
        >>> api.Experiment.open("no-such-search", db=url)
        Traceback (most recent call last):
        ...
        searcher.experiments.UsageError: experiment: no experiment with id or name 'no-such-search'
    """

    def __init__(self, experiment_id: int, db_url: str) -> None:
        self.id = experiment_id
        self.db_url = db_url
        #: The background driver this handle started (``detach=True``), if any.
        self._driver: subprocess.Popen[bytes] | None = None
        with session_scope(db_url) as session:
            row = session.get(ExperimentRow, experiment_id)
            if row is None:
                raise UsageError(f"experiment: no experiment with id {experiment_id}")
            self.name: str = row.name
            self._study_name = row.study_name

    @classmethod
    def open(cls, id_or_name: int | str, db: str | None = None) -> Experiment:
        """The experiment with this id, or the one experiment with this name, in ``db``.

        ``db`` is a database URL (None: ``$SLOTSWEEP_DB`` or ``sqlite:///slotsweep.db``);
        a database without slotsweep's tables is refused, and nothing is created.
        """
        db_url = open_database(db, need_schema=True)
        with session_scope(db_url) as session:
            experiment_id = find_experiment(session, str(id_or_name)).id
        return cls(experiment_id, db_url)

    def __repr__(self) -> str:
        return f"Experiment(id={self.id}, name={self.name!r}, state={self.state.value})"

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> ExperimentState:
        """ACTIVE while a search runs (or waits for a driver), else how it ended."""
        with session_scope(self.db_url) as session:
            row = session.get(ExperimentRow, self.id)
            assert row is not None  # experiments are never deleted
            return row.state

    def wait(self, timeout: float | None = None) -> ExperimentState:
        """Block until the search is no longer ACTIVE; its state then.

        Ctrl-C asks the search to pause (as ``slotsweep pause``) and goes on waiting for
        it to checkpoint and stop; a second Ctrl-C stops waiting (the search pauses all
        the same). Raises :class:`TimeoutError` after ``timeout`` seconds, and
        :class:`RuntimeError` when no driver runs the search (its process died, or it
        was created by :func:`submit` and never started).
        """
        started = time.monotonic()
        asked_pause = False
        with CtrlC() as ctrl_c:
            while True:
                try:
                    if ctrl_c.pressed > 1:
                        # Its handler raised already, unless a finalizer swallowed that.
                        raise KeyboardInterrupt
                    if ctrl_c.pressed and not asked_pause:
                        asked_pause = True
                        self._pause_on_ctrl_c()
                    state, alive = self._state_and_driver()
                    if state != ExperimentState.ACTIVE:
                        return state
                    waited = time.monotonic() - started
                    self._check_driver(alive, waited)
                    if timeout is not None and waited >= timeout:
                        raise TimeoutError(
                            f"experiment {self.id} is still {state.value} after {timeout:g} s"
                        )
                    time.sleep(POLL_S)
                except KeyboardInterrupt:
                    if not asked_pause:  # Two presses before the first was acted on.
                        self._pause_on_ctrl_c()
                    raise

    def _pause_on_ctrl_c(self) -> None:
        Console(stderr=True).print(
            f"Ctrl-C: {self.pause()} (Ctrl-C again to stop waiting)", highlight=False
        )

    def pause(self) -> str:
        """Ask the search to checkpoint its trials and pause (``slotsweep pause``); what happened."""
        return request_action(self.db_url, str(self.id), Action.PAUSE)

    def kill(self) -> str:
        """Stop the search now and cancel it (``slotsweep kill``); what happened."""
        return request_action(self.db_url, str(self.id), Action.KILL)

    def resume(
        self,
        *,
        cluster: str | Path | None = None,
        slots: int | None = None,
        relocate: Iterable[str] = (),
        detach: bool = False,
        progress: bool = True,
    ) -> Experiment:
        """Run the search on from where it stopped (``slotsweep resume``): see :func:`resume`."""
        return self._adopt(
            resume(
                self.id,
                db=self.db_url,
                cluster=cluster,
                slots=slots,
                relocate=relocate,
                detach=detach,
                progress=progress,
            )
        )

    def continue_search(
        self,
        max_trials: int | None = None,
        more_trials: int | None = None,
        *,
        cluster: str | Path | None = None,
        slots: int | None = None,
        relocate: Iterable[str] = (),
        detach: bool = False,
        progress: bool = True,
    ) -> Experiment:
        """Give the search more trials (``slotsweep continue``): see :func:`continue_search`."""
        return self._adopt(
            continue_search(
                self.id,
                max_trials=max_trials,
                more_trials=more_trials,
                db=self.db_url,
                cluster=cluster,
                slots=slots,
                relocate=relocate,
                detach=detach,
                progress=progress,
            )
        )

    # ------------------------------------------------------------------ reading
    def trials(self) -> pd.DataFrame:
        """One row per trial, by number: what ``slotsweep describe`` shows.

        Columns: ``number``, ``state``, ``searcher_metric``, ``hyperparameters`` (a dict),
        ``slot_seconds``, ``restarts`` and ``failure_reason``, then one column per
        hyperparameter, ``params_<name>`` (as Optuna's ``trials_dataframe`` names them;
        empty where a trial has no value for it).
        """
        import pandas as pd

        summaries = self._summaries()
        columns = [c for c in TrialSummary.__dataclass_fields__ if c != "experiment_id"]
        frame = pd.DataFrame(
            [{c: getattr(t, c) for c in columns} for t in summaries], columns=columns
        )
        names = sorted({name for t in summaries for name in t.hyperparameters})
        for name in names:
            frame[f"params_{name}"] = [t.hyperparameters.get(name) for t in summaries]
        return frame

    @property
    def best_trial(self) -> TrialSummary | None:
        """The completed trial with the best searcher metric; None before one completes."""
        with session_scope(self.db_url) as session:
            row = session.get(ExperimentRow, self.id)
            assert row is not None
            smaller = read_stored_config(row.config).searcher.smaller_is_better
            best = queries.best_trials(session, self.id, smaller_is_better=smaller, limit=1)
        return _summary(best[0]) if best else None

    def metrics(self, trial: TrialRef) -> pd.DataFrame:
        """Every metric ``trial`` recorded: one row per step and name.

        ``trial`` is its number (``3``), its label (``"#3"``, or ``"2.3"`` in experiment
        2) or its :class:`TrialSummary` (``experiment.best_trial``). Columns: ``step``,
        ``epoch``, ``kind`` (``training`` or ``validation``), ``name``, ``value`` (NaN
        where training diverged) and ``recorded_at``. Raises :class:`TypeError` for
        anything else, :class:`LookupError` for a trial the experiment does not have.
        """
        with session_scope(self.db_url) as session:
            return queries.metric_rows(session, self._trial_id(session, self._trial_number(trial)))

    def checkpoint_path(self, trial: TrialRef | None = None) -> Path | str:
        """The folder of ``trial``'s newest checkpoint (default: the best trial's).

        ``trial`` as :meth:`metrics` takes it. A checkpoint found damaged (CORRUPTED) is
        never the newest: its files stay, and the one before it is given.

        A checkpoint in object storage (``checkpoint_storage.path`` an fsspec URL) is
        given as its URL, a string, since :class:`~pathlib.Path` would mangle ``s3://``.

        Raises :class:`LookupError` when that trial has no completed checkpoint.
        """
        number = self._best_or(trial)
        with session_scope(self.db_url) as session:
            path = queries.newest_checkpoint_path(session, self._trial_id(session, number))
        if path is None:
            raise LookupError(f"trial {trial_label(self.id, number)} has no completed checkpoint")
        return path if is_url(path) else Path(path)

    def load_checkpoint(self, trial: TrialRef | None = None) -> dict[str, Any]:
        """The state dicts of :meth:`checkpoint_path`'s checkpoint, on the CPU.

        Read with ``torch.load(weights_only=True)``, once its files match their
        manifest's digests (:class:`~trials.CheckpointCorruptedError` otherwise):
        tensors and plain data only, so a checkpoint cannot run code as it loads. A managed trial's checkpoint holds its
        models' state dicts under ``"models"`` (in the order it wrapped them), ready for
        ``load_state_dict``.
        """
        # Imported here: trials.runtime loads torch, which nothing else of the API needs.
        from trials.runtime import read_checkpoint

        return read_checkpoint(self.checkpoint_path(trial))

    @property
    def study(self) -> optuna.Study:
        """The experiment's Optuna study, for Optuna's own analyses and plots."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.load_study(study_name=self._study_name, storage=optuna_storage(self.db_url))

    # ------------------------------------------------------------------ private
    def _adopt(self, other: Experiment) -> Experiment:
        """Take over the background driver ``other`` started; this handle, for chaining."""
        self._driver = other._driver
        return self

    def _state_and_driver(self) -> tuple[ExperimentState, bool]:
        with session_scope(self.db_url) as session:
            row = session.get(ExperimentRow, self.id)
            assert row is not None
            return row.state, driver_alive(row)

    def _check_driver(self, alive: bool, waited: float) -> None:
        """Raise when no driver runs this ACTIVE experiment, nor is about to."""
        if self._driver is not None:
            code = self._driver.poll()
            if code is None:
                return
            if self._state_and_driver()[0] != ExperimentState.ACTIVE:
                return  # It ended as it exited; the caller reads the state next.
            raise RuntimeError(
                f"experiment {self.id}: its driver exited with code {code} and the search "
                f"unfinished; its output is in {_driver_log(self.db_url, self.id)}"
            )
        if not alive and waited >= DRIVER_START_GRACE_S:
            raise RuntimeError(
                f"experiment {self.id} is ACTIVE but no driver runs it; resume() starts one"
            )

    def _summaries(self) -> list[TrialSummary]:
        with session_scope(self.db_url) as session:
            return [_summary(t) for t in queries.experiment_trials(session, self.id)]

    def _best_or(self, trial: TrialRef | None) -> int:
        """The number of the trial ``trial`` names; None names the best trial."""
        if trial is not None:
            return self._trial_number(trial)
        best = self.best_trial
        if best is None:
            raise LookupError(f"experiment {self.id} has no completed trial yet")
        return best.number

    def _trial_number(self, trial: TrialRef) -> int:
        """The number of the trial ``trial`` names.

        Raises :class:`TypeError` for a value that cannot name a trial and
        :class:`LookupError` for a label or summary of another experiment's trial; one
        line each, saying what was given and what is taken.
        """
        taken = (
            f"give its number (3), its label ('#3' or '{self.id}.3') or a TrialSummary "
            "(experiment.trials() lists them)"
        )
        if isinstance(trial, TrialSummary):
            if trial.experiment_id != self.id:
                raise LookupError(
                    f"trial: {trial.label} is a trial of experiment {trial.experiment_id}, "
                    f"not of experiment {self.id}"
                )
            return trial.number
        if isinstance(trial, numbers.Integral) and not isinstance(trial, bool):
            return int(trial)
        if isinstance(trial, str):
            parsed = parse_trial_label(trial)
            if parsed is None:
                raise LookupError(f"trial: {trial!r} names no trial; {taken}")
            experiment_id, number = parsed
            if experiment_id is not None and experiment_id != self.id:
                raise LookupError(
                    f"trial: {trial!r} names a trial of experiment {experiment_id}, "
                    f"not of experiment {self.id}"
                )
            return number
        raise TypeError(f"trial: got {trial!r} ({type(trial).__name__}); {taken}")

    def _trial_id(self, session: Any, number: int) -> int:
        trial_id = (
            queries.trial_id(session, self.id, number) if 0 <= number <= _MAX_NUMBER else None
        )
        if trial_id is None:
            count = queries.trial_total(session, self.id)
            which = (
                f"its trials are #0 to #{count - 1}"
                if count > 1
                else "its only trial is #0"
                if count
                else "it has no trials yet"
            )
            raise LookupError(f"experiment {self.id} has no trial #{number}; {which}")
        return trial_id


def _summary(trial: queries.TrialRow) -> TrialSummary:
    """The API's view of one of the read model's trials."""
    return TrialSummary(
        number=trial.number,
        state=trial.state.value,
        searcher_metric=trial.searcher_metric,
        hyperparameters=trial.hyperparameters,
        slot_seconds=trial.slot_seconds,
        restarts=trial.restarts,
        failure_reason=trial.error,
        experiment_id=trial.experiment_id,
    )


def submit(
    config: str | Path | Mapping[str, Any],
    *,
    db: str | None = None,
    cluster: str | Path | None = None,
    slots: int | None = None,
) -> Experiment:
    """Validate ``config`` and record the experiment, without running it (``run --detach``).

    Every check passes before anything is written (:func:`run` says which); the
    experiment is ACTIVE, waiting for :meth:`Experiment.resume` to start its driver.
    """
    experiment, _ = _submit(config, db=db, cluster=cluster, slots=slots)
    return experiment


def run(
    config: str | Path | Mapping[str, Any],
    *,
    db: str | None = None,
    cluster: str | Path | None = None,
    slots: int | None = None,
    detach: bool = False,
    progress: bool = True,
) -> Experiment:
    """Validate ``config``, record the experiment and run its search (``slotsweep run``).

    ``config`` is an experiment YAML file, or a mapping of the same shape (its
    ``entrypoint`` module is looked up in the current folder; or give the trial class
    itself, defined in an importable file). ``db`` is the database URL (None:
    ``$SLOTSWEEP_DB`` or ``sqlite:///slotsweep.db``); ``cluster`` a cluster file and
    ``slots`` the local agent's slots, as ``--cluster`` and ``--slots``.

    Without ``detach`` the search runs here and this returns when it ends (completed,
    paused by Ctrl-C or ``slotsweep pause``, killed, or failed: read ``.state``). With
    ``detach`` it returns at once, the driver running in a background process.

    Raises :class:`~trials.config.ConfigError` listing every problem (config, cluster,
    database, schedulability, entrypoint); nothing is then written.
    """
    experiment, validated = _submit(config, db=db, cluster=cluster, slots=slots)
    if detach:
        experiment._driver = _start_driver(experiment.id, experiment.db_url, cluster, slots, ())
    else:
        _drive(experiment.id, validated, progress)
    return experiment


def resume(
    id_or_name: int | str,
    *,
    db: str | None = None,
    cluster: str | Path | None = None,
    slots: int | None = None,
    relocate: Iterable[str] = (),
    detach: bool = False,
    progress: bool = True,
) -> Experiment:
    """Run a stored experiment on from where it stopped (``slotsweep resume``).

    Finished trials stay finished; interrupted ones continue from their newest
    checkpoint. ``relocate`` holds ``OLD=NEW`` pairs (``--relocate``) for a database
    whose folders moved. ``detach`` and ``progress`` as in :func:`run`.
    """
    relocation = Relocation.parse(relocate)
    experiment_id, validated = validate_stored_run(
        str(id_or_name), db, cluster_file=cluster, slots=slots, relocation=relocation
    )
    experiment = Experiment(experiment_id, validated.db_url)
    if detach:
        experiment._driver = _start_driver(
            experiment_id, validated.db_url, cluster, slots, list(relocate)
        )
        return experiment
    relocate_experiment(validated.db_url, experiment_id, relocation)
    _drive(experiment_id, validated, progress)
    return experiment


def continue_search(
    id_or_name: int | str,
    *,
    max_trials: int | None = None,
    more_trials: int | None = None,
    db: str | None = None,
    cluster: str | Path | None = None,
    slots: int | None = None,
    relocate: Iterable[str] = (),
    detach: bool = False,
    progress: bool = True,
) -> Experiment:
    """Raise a COMPLETED or PAUSED search's trial budget and run it on (``slotsweep continue``).

    Exactly one of ``max_trials`` (the new total) and ``more_trials`` (trials to add).
    The study, its trials and their checkpoints stay; new trials number on.
    """
    if (max_trials is None) == (more_trials is None):
        raise UsageError("continue: give exactly one of max_trials and more_trials")
    relocation = Relocation.parse(relocate)
    _, validated = validate_stored_run(
        str(id_or_name), db, cluster_file=cluster, slots=slots, relocation=relocation
    )
    experiment_id, config = extend_experiment(
        validated.db_url, str(id_or_name), max_trials=max_trials, more_trials=more_trials
    )
    experiment = Experiment(experiment_id, validated.db_url)
    Console(stderr=True).print(
        f"experiment {experiment_id}: budget raised to {config.searcher.max_trials} trials"
    )
    if detach:
        experiment._driver = _start_driver(
            experiment_id, validated.db_url, cluster, slots, list(relocate)
        )
        return experiment
    relocate_experiment(validated.db_url, experiment_id, relocation)
    _drive(experiment_id, validated.with_config(relocation.config(config)), progress)
    return experiment


def _submit(
    config: str | Path | Mapping[str, Any],
    *,
    db: str | None,
    cluster: str | Path | None,
    slots: int | None,
) -> tuple[Experiment, ValidatedRun]:
    """Validate, then record: the experiment and the run its driver takes."""
    config_path: Path | None = None
    model_dir: Path | None = None
    try:
        if isinstance(config, Mapping):
            config, model_dir = _with_entrypoint_name(config)
            validated = validate_new_run(
                config, db, cluster_file=cluster, slots=slots, model_dir=model_dir
            )
            model_dir = (model_dir or Path.cwd()).resolve()
        else:
            config_path = Path(config)
            validated = validate_new_run(config_path, db, cluster_file=cluster, slots=slots)
    except (ClusterConfigError, UsageError, UnknownPool, Unschedulable, DatabaseUrlError) as exc:
        # One exception for every problem a new run can have, as the CLI prints them.
        problems = exc.problems if isinstance(exc, ClusterConfigError) else [str(exc)]
        raise ConfigError(problems) from None
    experiment_id = create_experiment(
        validated.config,
        config_path=config_path,
        db_url=validated.db_url,
        directions=samplers.study_directions(validated.config),
        model_dir=model_dir,
    )
    console = Console(stderr=True)
    for note in validated.notes:
        console.print(note, highlight=False)
    console.print(f"experiment {experiment_id} ({validated.config.name}) created", highlight=False)
    return Experiment(experiment_id, validated.db_url), validated


def _with_entrypoint_name(config: Mapping[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """``config`` with a trial class given as itself named ``module:Class``, and the
    folder its module is imported from (None when the entrypoint is already a name).

    The ranks import the entrypoint by name in other processes, so a class must live in
    a file: one defined in a notebook or a script's ``__main__`` (or inside a function)
    is refused with one line saying so.
    """
    entrypoint = config.get("entrypoint")
    if isinstance(entrypoint, str) or not callable(entrypoint):
        return dict(config), None
    module_name = getattr(entrypoint, "__module__", None) or "__main__"
    qualname = getattr(entrypoint, "__qualname__", repr(entrypoint))
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if module_name == "__main__" or "<locals>" in qualname or file is None:
        raise ConfigError(
            [
                f"entrypoint: {qualname} is defined in a notebook, a script's __main__ or a "
                "function, which the trial processes cannot import; move it into a file "
                "(say model.py) and give it as 'model:" + qualname.rpartition(".")[2] + "'"
            ]
        )
    path = Path(file).resolve()
    depth = module_name.count(".") + (1 if path.name == "__init__.py" else 0)
    return {**config, "entrypoint": f"{module_name}:{qualname}"}, path.parents[depth]


def _drive(experiment_id: int, validated: ValidatedRun, progress: bool) -> ExperimentState:
    """Run the experiment's driver here, to its end (Ctrl-C pauses: the driver's handler)."""
    return SearchDriver(experiment_id, validated, show_progress=progress).run()


def _driver_log(db_url: str, experiment_id: int) -> Path:
    """The detached driver's output: ``driver.log`` in the experiment's log folder."""
    return stored_experiment_log_dir(db_url, experiment_id) / "driver.log"


def _start_driver(
    experiment_id: int,
    db_url: str,
    cluster: str | Path | None,
    slots: int | None,
    relocate: Iterable[str],
) -> subprocess.Popen[bytes]:
    """``slotsweep resume EXPERIMENT`` in a background process of its own session.

    Its own session: a notebook's Ctrl-C or its closing does not reach it (``pause()``
    and ``kill()`` do). The database URL goes in the environment, not the command line,
    where ``ps`` shows it to every user of the machine; output goes to the driver log.
    """
    argv = [sys.executable, "-m", "searcher.cli", "resume", str(experiment_id), "--no-progress"]
    if cluster is not None:
        argv += ["--cluster", str(Path(cluster).resolve())]
    if slots is not None:
        argv += ["--slots", str(slots)]
    for pair in relocate:
        argv += ["--relocate", pair]
    env = {**os.environ, DB_ENV_VAR: db_url}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (env.get("PYTHONPATH"), str(_PACKAGES_ROOT)) if p
    )
    log = _driver_log(db_url, experiment_id)
    with log.open("ab") as out:
        out.write(f"--- {_dt.datetime.now(_dt.UTC).isoformat()} driver started\n".encode())
        out.flush()
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
