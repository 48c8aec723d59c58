"""A search that fails tells the user why, at once, and does not retry a bug blindly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import (
    Experiment,
    ExperimentState,
    Trial,
    TrialFailure,
    TrialProcess,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import process_alive, run_cli, write_experiment
from trials.timings import TIMINGS_ENV_VAR

pytestmark = pytest.mark.slow

_BROKEN = textwrap.dedent(
    """
    from model import DigitsTrial


    class BrokenTrial(DigitsTrial):
        def __init__(self, context):
            raise ValueError("the head expects 64 features, got 63")
    """
)


def test_a_constructor_that_raises_is_not_restarted_and_the_experiment_stops(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="broken_model:BrokenTrial",
        searcher={"max_trials": 8, "max_concurrent_trials": 1, "pruner": {"name": "none"}},
        max_restarts=2,
        fail_fast_trials=2,  # the fewest that can compare errors; the default is 3
    )
    (path.parent / "broken_model.py").write_text(_BROKEN)
    db = f"sqlite:///{tmp_path / 'sweep.db'}"

    result = run_cli(["run", str(path), "--db", db, "--no-progress"], cli_env, tmp_path)

    assert result.returncode != 0, result.stderr[-3000:]
    assert "ValueError: the head expects 64 features, got 63" in result.stderr
    assert "first 2 trials all failed" in result.stderr
    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.ERROR
        trials = list(session.scalars(select(Trial).order_by(Trial.optuna_trial_number)))
        first = trials[:2]
        assert all(t.state == TrialState.ERROR for t in trials)
        for trial in first:
            assert "ValueError: the head expects 64 features, got 63" in (trial.error or "")
            assert "not restarted" in (trial.error or "")
            assert trial.restarts == 0
        # One launch each, never a restart; the budget's other trials never ran.
        runs = session.scalar(select(func.count()).select_from(TrialRun))
        assert runs == 2
        failure = session.scalars(select(TrialFailure).order_by(TrialFailure.id)).first()
        assert failure is not None
        assert failure.exception_type == "ValueError"
        assert "__init__" in failure.traceback
        assert failure.steps_completed == 0


_LINGERING = textwrap.dedent(
    """
    import atexit
    import time


    def objective(context):
        context.report_validation_metrics(1, {"val_loss": 0.25})
        # The trial's end is recorded once this returns; then every rank's exit waits
        # forever, as a hung exit handler or destructor would make it.
        atexit.register(time.sleep, 3600)
    """
)


def test_processes_that_outlive_their_trials_end_are_ended_and_the_trial_keeps_it(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Rank 0 recorded the trial's end; its processes never exit. Past ``exit_grace_s``
    the driver ends them (not after ``hang_timeout_s``), the trial stays COMPLETED with
    its metric, and the run says why it was ended."""
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="lingering:objective",
        searcher={
            "max_trials": 1,
            "max_length": {"batches": 1},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": 2},
        hang_timeout_s=3600,
    )
    (path.parent / "lingering.py").write_text(_LINGERING)
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    env = {**cli_env, TIMINGS_ENV_VAR: "exit_grace_s=2"}

    result = run_cli(["run", str(path), "--db", db, "--no-progress"], env, tmp_path, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.COMPLETED, trial.error
        assert trial.searcher_metric_value == 0.25
        (run,) = session.scalars(select(TrialRun))
        assert run.reason and "had not exited" in run.reason, run.reason
        assert "exit_grace_s 2" in run.reason
        processes = list(session.scalars(select(TrialProcess)))
    assert processes and not [p.pid for p in processes if process_alive(p)]
