"""A multi-objective search with pruning keeps its rung decisions through crashes.

The search of :mod:`tests.searcher.test_pareto_search_e2e` (accuracy against compute,
ASHA's rungs at 1 and 3 epochs, warm workers), slowed down, crashed twice: a power loss (the
driver and the trial's processes SIGKILLed) right after trial 0 was promoted at its first
rung and before its first checkpoint, so its restart meets that rung again; then the
driver alone SIGKILLed once a trial was pruned and a later one was running.
Resumed each time. Every decision made before a crash stands after it (a restarted
trial is not judged again where it was judged), a promoted trial is never pruned at a
rung it passed, a pruned trial never runs again, and the database is consistent.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import select

from storage import Checkpoint, Experiment, Trial, TrialRun, TrialState, session_scope
from tests.searcher.conftest import (
    assert_search_consistent,
    power_loss,
    run_to_end,
    start_cli,
    wait_for,
)
from tests.searcher.test_pareto_search_e2e import pareto_experiment
from trials.pruning import RungDecision, rung_decisions, stopped_at

pytestmark = pytest.mark.slow


def _decisions(db: str) -> dict[int, list[RungDecision]]:
    with session_scope(db) as session:
        study_name = session.scalars(select(Experiment.study_name)).one()
    study = optuna.load_study(study_name=study_name, storage=db)
    return rung_decisions(study.user_attrs)


def _promoted_without_checkpoint(db: str, number: int) -> bool:
    """Whether trial ``number`` passed its first rung and has no checkpoint yet.

    The checkpoint is looked for last, right before the caller's crash: loading the
    study for the decisions takes a while on a loaded machine.
    """
    with session_scope(db) as session:
        trial_id = session.scalar(select(Trial.id).where(Trial.optuna_trial_number == number))
    if trial_id is None:  # the search is starting: its study may not exist yet
        return False
    made = _decisions(db).get(number, [])
    if not (made and made[0].promoted):
        return False
    with session_scope(db) as session:
        return session.scalar(select(Checkpoint.id).where(Checkpoint.trial_id == trial_id)) is None


def _pruned_then_running(db: str) -> bool:
    """Whether a trial was pruned and a later one runs."""
    pruned = _pruned_trials(db)
    return bool(pruned) and any(number > min(pruned) for number in _running(db))


def _runs(db: str) -> dict[int, list[TrialRun]]:
    with session_scope(db) as session:
        trials = {t.id: t.optuna_trial_number for t in session.scalars(select(Trial))}
        runs: dict[int, list[TrialRun]] = {}
        for run in session.scalars(select(TrialRun).order_by(TrialRun.attempt)):
            runs.setdefault(trials[run.trial_id], []).append(run)
        session.expunge_all()
    return runs


def _ended_by_a_resume(runs: dict[int, list[TrialRun]]) -> set[int]:
    """The trials with a run a resume ended because its driver had died (the reason
    ``searcher.driver.running.end_leftovers`` records): a crash interrupted them."""
    return {
        number
        for number, each in runs.items()
        if any((run.reason or "").startswith("driver stopped") for run in each)
    }


def _running(db: str) -> set[int]:
    """The trials with a run not yet ended."""
    with session_scope(db) as session:
        return set(
            session.scalars(
                select(Trial.optuna_trial_number)
                .join(TrialRun, TrialRun.trial_id == Trial.id)
                .where(TrialRun.ended_at.is_(None))
            )
        )


def _pruned_trials(db: str) -> dict[int, dt.datetime]:
    with session_scope(db) as session:
        pruned = session.scalars(select(Trial).where(Trial.state == TrialState.PRUNED))
        return {t.optuna_trial_number: t.ended_at for t in pruned if t.ended_at is not None}


def test_rung_decisions_survive_a_power_loss_and_a_killed_driver(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    settings: dict[str, Any] = {
        "searcher": {"max_trials": 4},
        # About a second an epoch, and the first checkpoint at the second rung (3
        # epochs): trial 0 is crashed in the two epochs between its first rung and its
        # first checkpoint (one epoch was too short a window on a loaded CI run).
        "data": {"batch_delay_s": 0.04, "dear_trials": [1, 3], "dear_batch_delay_s": 0.06},
        "min_checkpoint_period": {"epochs": 3},
    }
    path = pareto_experiment(tmp_path / "exp", **settings)
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    common = ["--db", db, "--slots", "1"]
    resume = ["resume", "digits-large-batch", *common]

    # 1. Power loss right after trial 0 passed its first rung, before any checkpoint.
    driver = start_cli(["run", str(path), *common], cli_env, tmp_path)
    wait_for(lambda: _promoted_without_checkpoint(db, 0), what="trial 0 past its first rung")
    power_loss(driver, db)
    # Read after the crash: a trial the driver launched between a read and the kill
    # was interrupted too.
    interrupted = _running(db)
    before_power_loss = _decisions(db)

    # 2. The driver alone SIGKILLed once a trial was pruned and a later one runs.
    driver = start_cli(resume, cli_env, tmp_path)
    wait_for(lambda: _pruned_then_running(db), what="a pruned trial, and a later one running")
    driver.kill()
    driver.communicate(timeout=30)
    before_kill = _decisions(db)
    pruned_before_kill = _pruned_trials(db)
    # Its trials train on without it, and its warm job's rank 0 starts the trial the
    # driver had decided ahead at a hand-back, even after this read: every run open when
    # the resume comes was interrupted by the kill (the resume ends them, saying why,
    # and runs their trials on).
    interrupted |= _running(db)

    run_to_end(resume, cli_env, tmp_path)

    after = _decisions(db)
    for before in (before_power_loss, before_kill):
        for number, made in before.items():
            # Kept as made: a decision taken again would hold the new run's values.
            assert after[number][: len(made)] == made, number
            promoted_at = [d.rung for d in made if d.promoted]
            stop = stopped_at(after[number])
            assert stop is None or all(stop.rung > rung for rung in promoted_at), number
    runs = _runs(db)
    # Trial 0 restarted from nothing, so it met its first rung again (and kept it).
    assert [run.restored_from_step for run in runs[0]] == [None, None]
    assert after[0][0] == before_power_loss[0][0]
    # A pruned trial never runs again: no run of it started after the kill.
    for number, ended in pruned_before_kill.items():
        assert all(run.started_at <= ended for run in runs[number]), number
    # Only the trials the crashes interrupted ran more than once.
    interrupted |= _ended_by_a_resume(runs)
    assert interrupted >= {0}
    again = {
        number: [(run.attempt, run.reason) for run in each]
        for number, each in runs.items()
        if number not in interrupted and len(each) > 1
    }
    assert not again, again
    with session_scope(db) as session:
        states = {t.optuna_trial_number: t.state for t in session.scalars(select(Trial))}
    assert states[1] == states[3] == TrialState.PRUNED
    assert_search_consistent(db)
