"""A real search through the CLI: real torchrun jobs, a real SQLite file, a real study."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import optuna
import pytest
import yaml
from sqlalchemy import func, select

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    Trial,
    TrialState,
    session_scope,
)
from tests.conftest import EXAMPLES_DIR
from tests.real_search import MAX_TRIALS, RealSearch
from tests.searcher.conftest import run_cli, run_to_end, write_experiment

pytestmark = pytest.mark.slow

CHARLM = EXAMPLES_DIR / "charlm"


def test_small_search_end_to_end(
    real_search: RealSearch, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The digits example's small search (TPE, ASHA, trials of 2 slots, one at a time),
    run once per session through ``slotsweep run`` for the UI's tests too
    (:mod:`tests.real_search`): what it printed and recorded, and what ``list``
    and ``describe`` say of it."""
    db = real_search.url
    assert "Best trials" in real_search.output

    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert len(trials) == MAX_TRIALS
        for trial in trials:
            assert trial.state in (TrialState.COMPLETED, TrialState.PRUNED), trial.error
            assert trial.slots_per_trial == 2
            log = Path(trial.log_path or "").read_text()
            ranks = set(re.findall(r"^\[rank (\d+)\] ", log, flags=re.MULTILINE))
            assert ranks == {"0", "1"}, log[-2000:]
            validation = session.scalar(
                select(func.count()).where(
                    Metric.trial_id == trial.id, Metric.kind == MetricKind.VALIDATION
                )
            )
            assert validation and validation > 0
            checkpoints = list(
                session.scalars(
                    select(Checkpoint).where(
                        Checkpoint.trial_id == trial.id,
                        Checkpoint.state == CheckpointState.COMPLETED,
                    )
                )
            )
            # A pruned trial stops before writing the checkpoint of its last rung.
            if trial.state == TrialState.COMPLETED:
                assert checkpoints
            assert all(Path(c.path).exists() for c in checkpoints)
            # Retention: save_trial_latest 1 and save_trial_best 1 leave at most two.
            assert len(checkpoints) <= 2
        study_name = experiment.study_name

    study = optuna.load_study(study_name=study_name, storage=db)
    states = sorted(t.state.name for t in study.trials)
    assert len(states) == MAX_TRIALS and set(states) <= {"COMPLETE", "PRUNED"}

    listing = run_cli(["list", "--db", db], cli_env, tmp_path)
    assert listing.returncode == 0 and real_search.name in listing.stdout
    described = run_cli(["describe", real_search.name, "--db", db], cli_env, tmp_path)
    assert described.returncode == 0
    assert "global_batch_size=" in described.stdout and "step" in described.stdout


@pytest.mark.parametrize(
    ("pruner", "state", "optuna_state"),
    [("none", TrialState.ERROR, "FAIL"), ("asha", TrialState.PRUNED, "PRUNED")],
)
def test_diverged_trial_is_recorded_and_ends_without_restarts(
    tmp_path: Path,
    cli_env: dict[str, str],
    pruner: str,
    state: TrialState,
    optuna_state: str,
) -> None:
    """NaN losses are stored (as NULL); ASHA prunes the trial, without a pruner it fails
    with a message naming the divergence; either way it is not restarted. A search whose
    only trial failed ends ERROR and ``run`` exits 1."""
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="slow_model:DivergingDigitsTrial",
        searcher={"max_trials": 1, "max_length": {"epochs": 3}, "pruner": {"name": pruner}},
        resources={"slots_per_trial": 1},
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    result = run_cli(["run", str(path), "--db", db, "--no-progress"], cli_env, tmp_path)
    failed = state == TrialState.ERROR
    assert result.returncode == (1 if failed else 0), result.stderr[-4000:]

    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == (ExperimentState.ERROR if failed else ExperimentState.COMPLETED)
        trial = session.scalars(select(Trial)).one()
        assert trial.state == state, trial.error
        assert trial.restarts == 0
        if state == TrialState.ERROR:
            assert trial.error == (
                "the searcher metric 'val_loss' was NaN at the end of training (it diverged)"
            )
        losses = session.execute(
            select(Metric.kind, Metric.value).where(
                Metric.trial_id == trial.id, Metric.name.in_(["loss", "val_loss"])
            )
        ).all()
        assert {kind for kind, _ in losses} == {MetricKind.TRAINING, MetricKind.VALIDATION}
        assert all(
            value is None if kind == MetricKind.VALIDATION else value == float("inf")
            for kind, value in losses
        )
        study_name = session.scalars(select(Experiment.study_name)).one()
    study = optuna.load_study(study_name=study_name, storage=db)
    assert [t.state.name for t in study.trials] == [optuna_state]


def _charlm_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``examples/charlm/model.py``, imported under a name of its own (every example's
    module is ``model``), known to ``sys.modules`` while the test runs."""
    spec = importlib.util.spec_from_file_location("charlm_model", CHARLM / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "charlm_model", module)
    spec.loader.exec_module(module)
    return module


def test_the_charlm_cpu_search_learns_below_the_unigram_loss(
    tmp_path: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``examples/charlm/cpu.yaml`` as it is (TPE over the recipe and depth, ASHA on the
    validation loss, two 1-slot trials at once on warm workers): every trial ends, ASHA
    prunes some, and the best trial's loss is below the loss of predicting every
    character by its frequency in the training text, on the same validation windows."""
    shutil.copytree(CHARLM, tmp_path / "charlm", ignore=shutil.ignore_patterns("checkpoints"))
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    run_to_end(
        ["run", str(tmp_path / "charlm" / "cpu.yaml"), "--db", db, "--slots", "2"],
        cli_env,
        tmp_path,
    )
    config = yaml.safe_load((CHARLM / "cpu.yaml").read_text())
    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial)))
        states = [t.state for t in trials]
        assert len(trials) == config["searcher"]["max_trials"]
        assert set(states) <= {TrialState.COMPLETED, TrialState.PRUNED}, [t.error for t in trials]
        assert TrialState.PRUNED in states and TrialState.COMPLETED in states
        best = min(
            t.searcher_metric_value
            for t in trials
            if t.state == TrialState.COMPLETED and t.searcher_metric_value is not None
        )

    charlm = _charlm_module(monkeypatch)
    corpus = charlm.load_corpus()
    windows = charlm.Windows(
        corpus.val, config["hyperparameters"]["block_size"], config["data"]["val_windows"]
    )
    unigram = corpus.unigram_loss(windows.targets())
    assert 2.5 < unigram < 4.5, unigram  # Python source: a few bits a character
    assert best < unigram, (best, unigram)
