"""Validations reported to Optuna at the compute spent (``pruner.resource: slot_seconds``).

Rank 0 counts the trial's compute from its runs' rows, so an attempt restarted from a
checkpoint carries on from what its trial spent before; a ``max_length`` in
slot-seconds ends the managed loop at the first validation that spent it. One rank in
this process against a real SQLite database and Optuna study.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import optuna
from sqlalchemy import select, update

from storage import TrialRun, optuna_storage, session_scope, utcnow
from trials.runtime._distributed import DistributedInfo
from trials.runtime._recorder import ChiefRecorder
from trials.runtime._runner import run_trial

from .conftest import TrialHandle

ASHA = {"name": "SuccessiveHalvingPruner", "kwargs": {"min_resource": 100_000}}


def _intermediate_steps(handle: TrialHandle) -> list[int]:
    study = optuna.load_study(
        study_name=handle.spec.study_name, storage=optuna_storage(handle.db_url)
    )
    frozen = study.trials[handle.spec.optuna_trial_number]
    return sorted(frozen.intermediate_values)


def test_a_restarted_attempt_reports_at_its_trials_whole_compute(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(pruner=ASHA, pruner_resource="slot_seconds", slots_per_trial=2)
    now = utcnow()
    with session_scope(handle.db_url) as session:
        # Attempt 0 trained 3 s (after its start-up) before it died; 2 slots: 6 slot-s.
        session.execute(
            update(TrialRun)
            .where(TrialRun.trial_id == handle.spec.trial_id)
            .values(
                training_started_at=now - dt.timedelta(seconds=60),
                progress_at=now - dt.timedelta(seconds=57),
            )
        )
    restarted = handle.with_changes(attempt=1)
    recorder = ChiefRecorder(restarted.spec)
    try:
        recorder.training_started()
        recorder.report_compute(0.5, time.time())
        spent = recorder.compute_spent()
    finally:
        recorder.close()
    # 6 slot-seconds of attempt 0, and the moments since attempt 1 began training.
    assert 6.0 <= spent < 7.0
    assert len(_intermediate_steps(restarted)) == 1
    assert 600 <= _intermediate_steps(restarted)[0] < 700
    with session_scope(handle.db_url) as session:
        runs = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == handle.spec.trial_id)
        ).all()
        assert [run.training_started_at is not None for run in runs] == [True, True]


def test_a_compute_max_length_ends_training_at_the_first_validation_past_it(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        pruner=ASHA,
        pruner_resource="slot_seconds",
        slots_per_trial=1,
        max_length={"slot_seconds": 0.3},
        min_validation_period={"batches": 2},
        # A linear model without an LR schedule: its total length is not known ahead.
        hparams={"global_batch_size": 8, "linear": True},
        profiling={"enabled": False},
    )
    assert run_trial(handle.spec, DistributedInfo()) == "finished"
    steps = _intermediate_steps(handle)
    # Every validation at its own, growing compute; the last one at or past 0.3 slot-s.
    assert steps == sorted(set(steps)) and len(steps) >= 2
    assert steps[-1] >= 30 > steps[-2]
