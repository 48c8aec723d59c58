"""The search driver's parts, one at a time, without a running search.

The outcome decision (:func:`searcher.driver.outcomes.decide_outcome`) and the runtime spec
(:func:`searcher.driver.runtime_spec.build_runtime_spec`) are pure and tested without a
database; the queues and Ctrl-C need none either. Where a part does I/O (applying an
outcome), a fresh SQLite file stands in. The real-process tests (``test_search_e2e``,
``test_fault_tolerance``, ...) check the parts composed in :class:`SearchDriver`.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from searcher.driver.context import DriverContext, Timings
from searcher.driver.control import Control, install_signal_handlers, restore_signal_handlers
from searcher.driver.decisions import apply_decisions
from searcher.driver.failures import RunVerdict
from searcher.driver.outcomes import (
    PORT_CLASH_NOTE,
    PORT_CLASH_RETRIES,
    OutcomeFacts,
    Outcomes,
    decide_outcome,
)
from searcher.driver.placement import PendingQueue
from searcher.driver.runtime_spec import build_runtime_spec
from searcher.driver.study_side import TellQueue, max_trials, missing_hparams, objective_values
from searcher.logs import scratch_root
from storage import Checkpoint, Trial, TrialFailure, TrialRun, TrialState, session_scope
from tests.conftest import EXAMPLES_DIR, add_experiment
from trials import checkpoint_root
from trials.config import ExperimentConfig, parse_config
from trials.scheduler import Agent, ResourcePool
from trials.timings import timings_from_env

# ----------------------------------------------------------------- helpers


class _NoExecutor:
    """Stands in for an executor: these tests start no process."""

    name = "none"
    remote = False

    def launch(self, request: Any) -> Any:
        raise AssertionError("no attempt is started in these tests")


def _config(hyperparameters: dict[str, Any] | None = None, **searcher: Any) -> ExperimentConfig:
    """The digits example's config: ``searcher`` updates its section, ``hyperparameters`` replace it."""
    raw = yaml.safe_load((EXAMPLES_DIR / "digits" / "experiment.yaml").read_text())
    raw["searcher"].update(searcher)
    if hyperparameters is not None:
        raw["hyperparameters"] = hyperparameters
    return parse_config(raw)


def _ctx(config: ExperimentConfig | None = None, *, experiment_id: int = 3) -> DriverContext:
    return DriverContext(
        db_url="sqlite:////tmp/never-opened.db",
        experiment_id=experiment_id,
        study_name="study-3",
        model_dir=Path("/models/digits"),
        config=config or _config(),
        pool=ResourcePool("default", (Agent("a1", "127.0.0.1", (0, 1)), Agent("a2", "h2", (0,)))),
        executor=_NoExecutor(),
        run_dir=Path("/logs/experiment-3"),
        timings=Timings(),
        checkpoint_folder=f"{experiment_id}-5f0c2a9e41b7",
    )


def _facts(**overrides: Any) -> OutcomeFacts:
    """A trial that ended without recording anything, its first attempt, 2 restarts allowed."""
    settings: dict[str, Any] = {
        "pruned": False,
        "finished": False,
        "has_metric": False,
        "metric": "val_loss",
        "last_validation_nan": False,
        "verdict": None,
        "exit_code": 1,
        "cause": None,
        "restarts": 0,
        "max_restarts": 2,
    }
    return OutcomeFacts(**{**settings, **overrides})


def _trial(**overrides: Any) -> Trial:
    """A trial row as the driver holds it (never added to a session)."""
    fields: dict[str, Any] = {
        "id": 11,
        "experiment_id": 3,
        "optuna_trial_id": 40,
        "optuna_trial_number": 4,
        "state": TrialState.QUEUED,
        "hparams": {"global_batch_size": 64, "lr": 0.1},
        "slots_per_trial": 2,
        "slot_seconds": 0.0,
    }
    return Trial(**{**fields, **overrides})


# ----------------------------------------------------------------- the outcome decision


def test_a_pruned_trial_is_pruned_whatever_else_it_recorded() -> None:
    decision = decide_outcome(_facts(pruned=True, finished=True, has_metric=True))
    assert decision.state == TrialState.PRUNED
    assert decision.tell == "pruned"
    assert decision.error is None and not decision.requeue and not decision.notify


def test_a_finished_trial_with_its_metric_completes_whatever_its_exit_code() -> None:
    # torchrun can exit non-zero after a finished run (gloo teardown).
    decision = decide_outcome(_facts(finished=True, has_metric=True, exit_code=1))
    assert decision.state == TrialState.COMPLETED
    assert decision.tell == "values"
    assert decision.error is None and not decision.requeue


@pytest.mark.parametrize(
    ("nan", "error"),
    [
        (True, "the searcher metric 'val_loss' was NaN at the end of training (it diverged)"),
        (False, "the trial finished without reporting the searcher metric 'val_loss'"),
    ],
)
def test_a_finished_trial_without_its_metric_fails_at_once(nan: bool, error: str) -> None:
    decision = decide_outcome(_facts(finished=True, last_validation_nan=nan))
    assert decision.state == TrialState.ERROR
    assert decision.error == error
    assert decision.tell == "fail"
    # Neither restarted, nor written as a failure line, nor counted for fail-fast.
    assert not decision.requeue and decision.restarts is None
    assert not decision.notify and not decision.check_fail_fast


def test_a_failure_is_restarted_while_restarts_are_left() -> None:
    decision = decide_outcome(_facts(restarts=1))
    assert decision.state == TrialState.QUEUED and decision.requeue
    assert decision.restarts == 2
    assert decision.error == "exit code 1; restart 2 of 2"
    assert decision.tell is None
    assert decision.notify and not decision.check_fail_fast


def test_the_reason_is_the_first_failing_ranks_exception_else_the_cause_else_the_exit_code() -> (
    None
):
    verdict = RunVerdict(reason="OSError: disk full (rank 1)", deterministic=False)
    cause = "no progress for 61 s (hang_timeout_s 60); ended"
    assert decide_outcome(_facts(verdict=verdict, cause=cause)).error == (
        "OSError: disk full (rank 1); restart 1 of 2"
    )
    assert decide_outcome(_facts(cause=cause, exit_code=-9)).error == f"{cause}; restart 1 of 2"
    assert decide_outcome(_facts(exit_code=-9)).error == "exit code -9; restart 1 of 2"
    assert decide_outcome(_facts(exit_code=None)).error == "exit code None; restart 1 of 2"


def test_a_failure_past_its_restarts_fails_the_trial() -> None:
    decision = decide_outcome(_facts(restarts=2))
    assert decision.state == TrialState.ERROR and not decision.requeue
    assert decision.error == "exit code 1; failed after 2 restarts"
    assert decision.tell == "fail"
    assert decision.notify and decision.check_fail_fast


def test_a_run_that_failed_alike_before_its_first_step_is_not_restarted() -> None:
    verdict = RunVerdict(
        reason="ValueError: bad", deterministic=True, signature=("ValueError", "bad")
    )
    decision = decide_outcome(_facts(verdict=verdict, restarts=0, max_restarts=5))
    assert decision.state == TrialState.ERROR and decision.restarts is None
    assert decision.error == (
        "ValueError: bad; it failed this way before its first step, so it is not restarted"
    )
    assert decision.tell == "fail"
    assert decision.notify and decision.check_fail_fast


def test_max_restarts_zero_fails_the_first_failure() -> None:
    decision = decide_outcome(_facts(max_restarts=0))
    assert decision.state == TrialState.ERROR
    assert decision.error == "exit code 1; failed after 0 restarts"


_CLASH = RunVerdict(
    reason="DistNetworkError: ... EADDRINUSE ... (rank 0)", deterministic=False, port_clash=True
)


def test_a_port_clash_starts_the_trial_again_counting_no_restart() -> None:
    decision = decide_outcome(_facts(verdict=_CLASH, restarts=1, max_restarts=1))
    assert decision.state == TrialState.QUEUED and decision.requeue
    # Even with no restart left: the run never started.
    assert decision.restarts == 1 and decision.error is None and decision.tell is None
    assert decision.note == PORT_CLASH_NOTE
    assert not decision.notify and not decision.check_fail_fast


def test_port_clashes_in_a_row_count_as_failures_past_their_allowance() -> None:
    last_free = decide_outcome(_facts(verdict=_CLASH, port_clashes_before=PORT_CLASH_RETRIES - 1))
    assert last_free.restarts == 0 and last_free.note == PORT_CLASH_NOTE
    # A port that is always taken is no race: the failure counts as any other.
    counted = decide_outcome(_facts(verdict=_CLASH, port_clashes_before=PORT_CLASH_RETRIES))
    assert counted.requeue and counted.restarts == 1 and counted.note is None
    assert counted.error == "DistNetworkError: ... EADDRINUSE ... (rank 0); restart 1 of 2"


# ----------------------------------------------------------------- the runtime spec


def test_the_runtime_spec_is_built_from_the_context_trial_and_checkpoint_alone() -> None:
    ctx = _ctx(_config(seed=100))
    checkpoint = Checkpoint(path="/ckpt/step-40", step=40, uuid="u")
    spec = build_runtime_spec(ctx, _trial(), attempt=2, checkpoint=checkpoint)
    assert (spec.experiment_id, spec.trial_id, spec.attempt) == (3, 11, 2)
    assert (spec.optuna_trial_id, spec.optuna_trial_number) == (40, 4)
    assert spec.study_name == "study-3"
    assert spec.db_url == ctx.db_url  # left out of what reaches the command line
    assert spec.model_dir == "/models/digits"
    assert spec.hparams == {"global_batch_size": 64, "lr": 0.1}
    assert spec.slots_per_trial == 2
    assert spec.seed == 104  # distinct per trial, reproducible from the experiment seed
    assert spec.restore_checkpoint_path == "/ckpt/step-40"
    assert spec.checkpoint_storage.path == "/models/digits/checkpoints"
    assert spec.checkpoint_folder == "3-5f0c2a9e41b7"  # the experiment's, as its row says
    # Per trial, in the experiment's own folder (named by its log folder and that path).
    assert Path(spec.scratch_dir).parent == scratch_root(Path("/logs/experiment-3"))
    assert Path(spec.scratch_dir).name == "trial-11"
    assert spec.agent == "a1"
    assert spec.searcher_metric == "val_loss" and spec.smaller_is_better
    assert spec.pruning and spec.pruner is not None
    # Pure: the same inputs give the same spec.
    assert build_runtime_spec(ctx, _trial(), 2, checkpoint) == spec


def test_a_first_attempt_without_seed_restores_nothing() -> None:
    spec = build_runtime_spec(_ctx(_config(seed=None)), _trial(), attempt=0, checkpoint=None)
    assert spec.seed is None
    assert spec.restore_checkpoint_path is None


def test_the_checkpoint_root_is_relative_to_the_model_dir_unless_absolute() -> None:
    config = _config()
    assert checkpoint_root(config, Path("/m")) == Path("/m/checkpoints")
    absolute = config.model_copy(
        update={"checkpoint_storage": config.checkpoint_storage.model_copy(update={"path": "/c"})}
    )
    assert checkpoint_root(absolute, Path("/m")) == Path("/c")


# ----------------------------------------------------------------- the study side


def test_max_trials_is_capped_by_a_smaller_grid() -> None:
    assert max_trials(_config(max_trials=8)) == 8
    grid = _config(
        {"global_batch_size": 64, "x": {"type": "categorical", "vals": [1, 2, 3]}},
        max_trials=1000,
        name="grid",
        pruner={"name": "none"},
    )
    assert max_trials(grid) == 3


def test_missing_hparams_lists_the_configs_names_without_a_value() -> None:
    config = _config()
    names = sorted(config.hyperparameters)
    assert missing_hparams(config, dict.fromkeys(names, 1)) == []
    assert missing_hparams(config, {n: 1 for n in names if n != "lr"}) == ["lr"]


def test_objective_values_are_the_metric_then_each_objective() -> None:
    config = _config(objectives=["slot_seconds"], pruner={"name": "none"})
    trial = _trial(searcher_metric_value=0.25, slot_seconds=64.0)
    assert objective_values(config, trial) == [0.25, 64.0]


class _Study:
    """Records the tells; fails the one numbered ``fail_on`` once."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.told: list[tuple[int, Any, Any, bool]] = []
        self.fail_on = fail_on

    def tell(self, number: int, values: Any, *, state: Any, skip_if_finished: bool) -> None:
        if number == self.fail_on:
            self.fail_on = None
            raise ConnectionError("lost")
        self.told.append((number, values, state, skip_if_finished))


def test_tells_go_out_in_order_and_stay_queued_until_told() -> None:
    tells = TellQueue()
    tells.tell(_trial(optuna_trial_number=1), values=[0.5])
    tells.tell(_trial(optuna_trial_number=2), state=optuna.trial.TrialState.PRUNED)
    tells.tell(_trial(optuna_trial_number=3), state=optuna.trial.TrialState.FAIL)
    study = _Study(fail_on=2)
    with pytest.raises(ConnectionError):
        tells.flush(study)  # type: ignore[arg-type]
    assert [n for n, *_ in study.told] == [1]
    assert [n for n, *_ in tells.queued] == [2, 3]
    tells.flush(study)  # type: ignore[arg-type]
    assert study.told == [
        (1, [0.5], None, True),
        (2, None, optuna.trial.TrialState.PRUNED, True),
        (3, None, optuna.trial.TrialState.FAIL, True),
    ]
    assert tells.queued == []


# ----------------------------------------------------------------- placement and control


def test_a_trial_is_queued_once_with_the_experiments_priority() -> None:
    pending = PendingQueue(_ctx())
    pending.queue(_trial(id=5))
    pending.queue(_trial(id=5))  # a retried tick queues it again
    pending.queue(_trial(id=6, slots_per_trial=1))
    assert len(pending) == 2


def test_ctrl_c_asks_for_a_pause_then_stops_now() -> None:
    control = Control()
    before = signal.getsignal(signal.SIGINT)
    install_signal_handlers(control)
    try:
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler) and handler is not before
        handler(signal.SIGINT, None)
        assert (control.interrupts, control.action) == (1, "pause")
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
    finally:
        restore_signal_handlers(control)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_driver_keeps_its_tunables_where_they_were() -> None:
    assert timings_from_env({}) == Timings(
        heartbeat_every_s=2.0,
        lease_s=30.0,
        driver_stale_after_s=20.0,
        preempt_grace_s=120.0,
        startup_allowance_s=120.0,
        kill_grace_s=10.0,
    )


# ----------------------------------------------------------------- applying an outcome


def _outcomes(db_url: str, experiment_id: int) -> tuple[Outcomes, TellQueue, PendingQueue]:
    ctx = replace(_ctx(experiment_id=experiment_id), db_url=db_url)
    tells, pending = TellQueue(), PendingQueue(ctx)
    return Outcomes(ctx, tells, Control()), tells, pending


def _finalize(
    outcomes: Outcomes, pending: PendingQueue, session: Session, trial: Trial, **facts: Any
) -> None:
    """Record the trial's outcome and apply what it decided, as the driver's tick does."""
    decisions = outcomes.finalize(session, trial, **facts)
    apply_decisions(decisions, pending, outcomes.control)


def test_a_restart_is_queued_and_written_to_the_trials_log(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "trial-0.log"
    experiment_id, (trial_id,) = add_experiment(db_url, [{"log_path": str(log)}])
    outcomes, tells, pending = _outcomes(db_url, experiment_id)
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        _finalize(outcomes, pending, session, trial, exit_code=-9)
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        assert (trial.state, trial.restarts) == (TrialState.QUEUED, 1)
        assert trial.error == "exit code -9; restart 1 of 2"
        assert trial.ended_at is None
    assert len(pending) == 1 and tells.queued == []
    assert f"trial {experiment_id}.0 failed: exit code -9; restart 1 of 2" in log.read_text()


def _clashed_run(db_url: str, trial_id: int, attempt: int) -> None:
    """A run of the trial whose rank 0 found its ``MASTER_PORT`` taken."""
    with session_scope(db_url) as session:
        run = TrialRun(trial_id=trial_id, attempt=attempt, executor="local", agents=[])
        session.add(run)
        session.flush()
        session.add(
            TrialFailure(
                run_id=run.id,
                trial_id=trial_id,
                rank=0,
                exception_type="DistNetworkError",
                message="The server socket has failed to listen ... name: EADDRINUSE",
                traceback="",
                steps_completed=0,
            )
        )


def test_a_port_clash_is_queued_noted_and_not_counted_until_it_repeats(
    db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "trial-0.log"
    experiment_id, (trial_id,) = add_experiment(db_url, [{"log_path": str(log)}])
    outcomes, tells, pending = _outcomes(db_url, experiment_id)

    def finalize() -> Trial:
        with session_scope(db_url) as session:
            trial = session.get(Trial, trial_id)
            assert trial is not None
            _finalize(outcomes, pending, session, trial, exit_code=1)
            session.flush()
            session.expunge(trial)
            return trial

    for attempt in range(PORT_CLASH_RETRIES):
        _clashed_run(db_url, trial_id, attempt)
        trial = finalize()
        assert (trial.state, trial.restarts, trial.error) == (TrialState.QUEUED, 0, None)
    assert len(pending) == 1 and tells.queued == []
    with session_scope(db_url) as session:
        reasons = session.scalars(select(TrialRun.reason).where(TrialRun.trial_id == trial_id))
        assert list(reasons) == [PORT_CLASH_NOTE] * PORT_CLASH_RETRIES
    lines = log.read_text().splitlines()
    assert (
        lines == [f"[slotsweep] trial {experiment_id}.0: {PORT_CLASH_NOTE}"] * PORT_CLASH_RETRIES
    )
    # One clash more in a row: a restart is counted.
    _clashed_run(db_url, trial_id, PORT_CLASH_RETRIES)
    trial = finalize()
    assert (trial.state, trial.restarts) == (TrialState.QUEUED, 1)
    assert trial.error is not None and trial.error.endswith("(rank 0); restart 1 of 2")


def test_a_completed_trial_is_told_its_values(db_url: str) -> None:
    experiment_id, (trial_id,) = add_experiment(db_url)
    outcomes, tells, pending = _outcomes(db_url, experiment_id)
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        trial.finished_at = trial.created_at
        trial.searcher_metric_value = 0.5
        _finalize(outcomes, pending, session, trial, exit_code=1)
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        assert trial.state == TrialState.COMPLETED and trial.ended_at is not None
        assert trial.error is None
    assert tells.queued == [(0, [0.5], None)] and len(pending) == 0


def test_a_trial_out_of_restarts_fails_and_optuna_hears_fail(db_url: str) -> None:
    experiment_id, (trial_id,) = add_experiment(db_url, [{"restarts": 2}])
    outcomes, tells, _ = _outcomes(db_url, experiment_id)
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        outcomes.finalize(session, trial, exit_code=None, cause="did not start within 130 s")
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        assert trial.state == TrialState.ERROR and trial.ended_at is not None
        assert trial.error == "did not start within 130 s; failed after 2 restarts"
    assert tells.queued == [(0, None, optuna.trial.TrialState.FAIL)]


def test_an_attempt_the_cluster_stopped_resumes_without_counting_a_restart() -> None:
    decision = decide_outcome(_facts(restarts=1, exit_code=0, stopped_by_cluster="preempted"))
    assert decision.state == TrialState.QUEUED and decision.requeue
    assert decision.restarts == 1 and decision.error is None and not decision.notify
    # A trial that finished before the cluster stopped it is simply finished.
    done = decide_outcome(_facts(finished=True, has_metric=True, stopped_by_cluster="preempted"))
    assert done.state == TrialState.COMPLETED
    # Even at max_restarts: it is no failure.
    assert decide_outcome(_facts(restarts=2, stopped_by_cluster="time limit")).requeue
