"""``slotsweep run --test CONFIG``: one short trial end to end, nothing recorded for good.

Determined's ``--test`` for slotsweep: before a search spends hours, run its code once on
the configured slots through the real path (the driver, torchrun, the managed loop)
and say what happened, phase by phase:

1. ``entrypoint``: the entrypoint resolves (:func:`searcher.submit.preflight.check_entrypoint`).
2. ``trial``: one trial at the first point of the space trains :data:`TEST_BATCHES`
   batches, validates once and writes checkpoints (after batch
   :data:`CHECKPOINT_AFTER` and at the end). The first point is the first point of
   Optuna's grid order: the first value of every categorical and the lower bound of
   every numeric range (``minval``; constants keep their value).
3. ``restore``: a second attempt of the same trial restores the latest checkpoint
   through the runtime's own loader and trains :data:`RESTORE_BATCHES` more batches.

Everything goes to a temporary directory that is removed afterwards: an SQLite database,
the checkpoints, the logs and the trials' scratch space. The user's database and
``checkpoint_storage.path`` are never touched. The temporary database holds no slot
claims of other searches, so run the test when the slots are free.

Exit codes: 0 when every phase passed, 1 when the trial failed (with the exception of
the rank that failed first), 2 for a config that cannot run (raised as
:class:`~trials.config.ConfigError` or the scheduler's errors, which the CLI turns
into one line per problem and exit code 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from searcher.driver.failures import FailureRecord
from trials.config import ConfigError, ConstHP, ExperimentConfig, load_config, parse_config
from trials.numbers import format_value

if TYPE_CHECKING:
    from searcher.submit.submission import ValidatedRun

TEST_BATCHES = 4
CHECKPOINT_AFTER = 2
RESTORE_BATCHES = 2
# A trial of a few batches that runs longer than this is stuck (a hung rendezvous).
RESTORE_TIMEOUT_S = 600.0
LOG_TAIL_LINES = 15


def run_trial_test(
    config_path: Path,
    *,
    cluster: str | Path | None,
    slots: int | None,
    out: TextIO | None = None,
) -> int:
    """Run the test trial of the experiment at ``config_path``; the exit code (see module).

    ``cluster`` and ``slots`` are the CLI's ``--cluster`` and ``--slots``
    (:func:`trials.executors.load_cluster`). Lines go to ``out`` (default stdout).
    """
    from searcher.submit.preflight import check_entrypoint
    from searcher.submit.submission import validate_run
    from trials.executors import load_cluster

    out = out or sys.stdout
    config_path = Path(config_path)
    config = load_config(config_path)
    loaded = load_cluster(cluster, slots=slots)
    model_dir = config_path.resolve().parent
    with tempfile.TemporaryDirectory(prefix="slotsweep-test-") as tmp:
        folder = Path(tmp)
        run = validate_run(_test_config(config, folder), loaded, f"sqlite:///{folder / 'test.db'}")
        started = time.monotonic()
        problems = check_entrypoint(config, model_dir)
        if problems:
            raise ConfigError(problems)
        _say(out, "entrypoint", "ok", f"{config.entrypoint} resolves", started)
        return _TestRun(folder, run, config_path, out).run()


def first_point(config: ExperimentConfig) -> dict[str, str]:
    """The first point of the space, as ``slotsweep enqueue`` takes it (``name -> text``).

    Example:
        >>> first_point(config)
        {'global_batch_size': '32', 'lr': '0.0001', 'warmup_epochs': '0', 'lr_decay': 'constant', 'optimizer': 'sgd', 'weight_decay': '1e-06'}
    """
    from trials.config import CategoricalHP

    point: dict[str, str] = {}
    for name, hp in config.hyperparameters.items():
        if isinstance(hp, ConstHP):
            continue
        if isinstance(hp, CategoricalHP):
            value = hp.vals[0]
            point[name] = value if isinstance(value, str) else json.dumps(value)
        else:
            point[name] = repr(hp.minval)
    return point


def _test_config(config: ExperimentConfig, folder: Path) -> ExperimentConfig:
    """``config`` cut down to the test trial: one trial, a few batches, no restarts.

    Its checkpoints go to ``folder`` (the test's temporary directory), never to
    ``checkpoint_storage.path``.
    """
    raw: dict[str, Any] = config.model_dump(mode="json")
    searcher = raw["searcher"]
    searcher.update(
        max_trials=1,
        max_concurrent_trials=1,
        max_length={"batches": TEST_BATCHES},
        pruner={"name": "none"},
    )
    if searcher["name"] == "grid":
        searcher["name"] = "random"  # the enqueued point runs either way; no count needed
    # Only the first point runs: checking every slots_per_trial choice would refuse a
    # search whose largest choice fits a cluster the test never uses.
    hparams = raw["hyperparameters"]
    point = first_point(config)
    if "slots_per_trial" in point:
        hparams["slots_per_trial"] = int(point["slots_per_trial"])
    raw.update(
        min_validation_period={"batches": TEST_BATCHES},
        min_checkpoint_period={"batches": CHECKPOINT_AFTER},
        max_restarts=0,
    )
    raw["checkpoint_storage"]["path"] = str(folder / "checkpoints")
    return parse_config(raw)


class _TestRun:
    """The test trial's phases inside one temporary directory."""

    def __init__(
        self,
        tmp: Path,
        validated: ValidatedRun,
        config_path: Path,
        out: TextIO,
    ) -> None:
        self.tmp = tmp
        self.validated = validated
        self.db_url = validated.db_url
        self.config = validated.config
        self.config_path = config_path
        self.out = out

    def run(self) -> int:
        with temporary_places(self.tmp):
            experiment_id = self._create()
            started = time.monotonic()
            self._drive(experiment_id)
            trained = self._report_trial(started)
            if trained is None:
                return 1
            started = time.monotonic()
            if not self._restore(*trained, started=started):
                return 1
        self.out.write("slotsweep test: passed; nothing was recorded\n")
        return 0

    # -- phase 2: the trial through the real driver --------------------------------------

    def _create(self) -> int:
        import optuna

        import searcher.submit.samplers as samplers
        import searcher.submit.space as space
        from searcher.submit.creation import create_experiment
        from storage import optuna_storage, session_scope

        experiment_id = create_experiment(
            self.config,
            config_path=self.config_path,
            db_url=self.db_url,
            directions=samplers.study_directions(self.config),
        )
        point = first_point(self.config)
        params = space.parse_enqueue_params(
            self.config.hyperparameters, [f"{k}={v}" for k, v in point.items()]
        )
        with session_scope(self.db_url) as session:
            from storage import Experiment

            experiment = session.get(Experiment, experiment_id)
            assert experiment is not None
            study_name = experiment.study_name
        study = optuna.load_study(study_name=study_name, storage=optuna_storage(self.db_url))
        study.enqueue_trial(params)
        shown = ", ".join(f"{k}={v}" for k, v in point.items()) or "no searched hyperparameters"
        self.out.write(f"slotsweep test: first point of the space: {shown}\n")
        return experiment_id

    def _drive(self, experiment_id: int) -> None:
        from searcher.driver.driver import SearchDriver

        SearchDriver(experiment_id, self.validated, show_progress=False).run()

    def _report_trial(self, started: float) -> tuple[int, Any] | None:
        """Say how the trial went; ``(trial id, latest checkpoint)`` if it passed."""
        from sqlalchemy import select

        from storage import (
            Checkpoint,
            CheckpointState,
            Metric,
            MetricKind,
            Trial,
            TrialState,
            session_scope,
        )

        with session_scope(self.db_url) as session:
            trial = session.scalars(select(Trial)).first()
            if trial is None:
                _say(self.out, "trial", "FAILED", "the driver started no trial", started)
                return None
            checkpoint = session.scalars(
                select(Checkpoint)
                .where(
                    Checkpoint.trial_id == trial.id, Checkpoint.state == CheckpointState.COMPLETED
                )
                .order_by(Checkpoint.step.desc())
            ).first()
            validations = session.scalars(
                select(Metric).where(
                    Metric.trial_id == trial.id, Metric.kind == MetricKind.VALIDATION
                )
            ).all()
            trial_id, state = trial.id, trial.state
            batches, log_path = trial.total_batches or 0, trial.log_path
            if state != TrialState.COMPLETED:
                _say(self.out, "trial", "FAILED", failure_line(session, trial), started)
                self._show_log_tail(log_path)
                return None
            session.expunge_all()
        metric = self.config.searcher.metric
        values = [m for m in validations if m.name == metric]
        _say(self.out, "training", "ok", f"{batches} batches", started)
        if not values:
            _say(self.out, "validation", "FAILED", f"no '{metric}' was reported", None)
            return None
        _say(self.out, "validation", "ok", f"{metric}={format_value(values[-1].value)}", None)
        if checkpoint is None:
            _say(self.out, "checkpoint", "FAILED", "no checkpoint was written", None)
            return None
        _say(self.out, "checkpoint", "ok", f"saved after batch {checkpoint.step}", None)
        return trial_id, checkpoint

    def _show_log_tail(self, log_path: str | None) -> None:
        if not log_path or not Path(log_path).is_file():
            return
        lines = Path(log_path).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        self.out.write(f"slotsweep test: the last {len(lines)} lines of the trial's log:\n")
        self.out.writelines(f"  {line}\n" for line in lines)

    # -- phase 3: restore the checkpoint in a second attempt ---------------------------

    def _restore(self, trial_id: int, checkpoint: Any, *, started: float) -> bool:
        """Run attempt 1 of the trial from ``checkpoint`` on the slots attempt 0 used."""
        from sqlalchemy import select

        from storage import Trial, TrialRun, session_scope
        from trials import RuntimeSpec
        from trials.executors import LaunchRequest
        from trials.launch.launcher import DB_URL_ENV_VAR
        from trials.scheduler import AgentSlots, Placement

        executor = self.validated.executor
        with session_scope(self.db_url) as session:
            first = session.scalars(
                select(TrialRun).where(TrialRun.trial_id == trial_id, TrialRun.attempt == 0)
            ).one()
            agents = list(first.agents or [])
            # The spec the driver launched attempt 0 with, now restoring the checkpoint
            # and training a few batches past it.
            fields = dict(first.spec or {})
            trial = session.get(Trial, trial_id)
            assert trial is not None
            log_path = Path(str(trial.log_path))
            # Set again only if the restored attempt trains to its end.
            trial.finished_at = None
            run = TrialRun(
                trial_id=trial_id,
                attempt=1,
                executor=executor.name,
                launch_token=uuid.uuid4().hex,
                restored_from_checkpoint=checkpoint.uuid,
                restored_from_step=checkpoint.step,
            )
            session.add(run)
            session.flush()
            token = str(run.launch_token)
        fields.update(
            db_url=self.db_url,
            attempt=1,
            restore_checkpoint_path=checkpoint.path,
            max_length={"batches": checkpoint.step + RESTORE_BATCHES},
        )
        spec = RuntimeSpec.model_validate(fields)
        pool = self.validated.pool
        by_name = {agent.name: agent for agent in pool.agents}
        placement = Placement(
            request_id=f"test-{trial_id}",
            pool=pool.name,
            agents=tuple(
                AgentSlots(agent=by_name[a["agent"]], slots=tuple(a["slots"])) for a in agents
            ),
        )
        processes = executor.launch(
            LaunchRequest(
                placement=placement,
                slots=sum(len(a["slots"]) for a in agents),
                spec_json=spec.model_dump_json(exclude={"db_url"}),
                rdzv_id=f"slotsweep-test-{trial_id}-1",
                token=token,
                log_path=log_path,
                cwd=self.config_path.resolve().parent,
                env={DB_URL_ENV_VAR: self.db_url},
            )
        )
        deadline = time.monotonic() + RESTORE_TIMEOUT_S
        exit_code = processes.poll()
        while exit_code is None and time.monotonic() < deadline:
            time.sleep(0.1)
            exit_code = processes.poll()
        if exit_code is None:
            processes.end(grace_s=5.0)
        with session_scope(self.db_url) as session:
            trial = session.get(Trial, trial_id)
            assert trial is not None
            batches = trial.total_batches or 0
            target = checkpoint.step + RESTORE_BATCHES
            # The outcome is what the attempt recorded, not torchrun's exit code alone.
            if trial.finished_at is not None and batches >= target and exit_code is not None:
                _say(
                    self.out,
                    "restore",
                    "ok",
                    f"resumed after batch {checkpoint.step}, trained to batch {batches}",
                    started,
                )
                return True
            trial.exit_code = exit_code
            reason = (
                f"did not end within {RESTORE_TIMEOUT_S:g} s"
                if exit_code is None
                else failure_line(session, trial)
            )
        _say(self.out, "restore", "FAILED", reason, started)
        self._show_log_tail(str(log_path))
        return False


def failure_line(session: Any, trial: Any) -> str:
    """One line for a failed trial: the failure of the rank that failed first (its own
    exception and message), else the trial's state and exit code."""
    from sqlalchemy import select

    from storage import TrialFailure

    failure = session.scalars(
        select(TrialFailure)
        .where(TrialFailure.trial_id == trial.id)
        .order_by(TrialFailure.recorded_at, TrialFailure.id)
    ).first()
    if failure is None:
        return f"{trial.state.value}, exit code {trial.exit_code}"
    who = FailureRecord(
        failure.rank, failure.exception_type, failure.message, failure.steps_completed
    ).who
    return (
        f"{who}: {failure.exception_type}: {failure.message} "
        f"(after {failure.steps_completed} batches)"
    )


@contextlib.contextmanager
def temporary_places(tmp: Path) -> Iterator[None]:
    """Logs and the trials' scratch space under ``tmp`` while the test runs."""
    saved_log_dir = os.environ.get("SLOTSWEEP_LOG_DIR")
    saved_tempdir = tempfile.tempdir
    os.environ["SLOTSWEEP_LOG_DIR"] = str(tmp / "logs")
    (tmp / "scratch").mkdir()
    tempfile.tempdir = str(tmp / "scratch")
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_log_dir is None:
            os.environ.pop("SLOTSWEEP_LOG_DIR", None)
        else:
            os.environ["SLOTSWEEP_LOG_DIR"] = saved_log_dir


def _say(out: TextIO, phase: str, verdict: str, detail: str, started: float | None) -> None:
    took = f" ({time.monotonic() - started:.1f} s)" if started is not None else ""
    out.write(f"slotsweep test: {phase:<10} {verdict:<6} {detail}{took}\n")
    out.flush()
