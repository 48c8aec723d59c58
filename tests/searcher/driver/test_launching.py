"""Placement hands its placements to the launching step, which settles each launch.

The driver's tick places the waiting trials (:meth:`searcher.driver.placement.PendingQueue.place`,
whose decision claims their slots), launches them (:meth:`searcher.driver.running.RunningTrials.launch`)
and applies what the launches decided. Here the launches fail, without processes, on a
real SQLite file: a trial that started nothing waits again, one whose launch failed for
good is failed, and a transient database error stops the launches with the later
placements' claims given back.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from searcher.driver.control import Control
from searcher.driver.decisions import Requeue, apply_decisions
from searcher.driver.launching import EarlierAttemptRunning
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import PendingQueue
from searcher.driver.running import RunningTrials
from searcher.driver.study_side import TellQueue
from searcher.driver.warm import IdleJob, IdleWarmJobs
from storage import Experiment, Trial, TrialRun, TrialState, WarmJob, session_scope, utcnow
from tests.conftest import add_experiment
from tests.searcher.driver.test_claim_fencing import _holders, _RecordingExecutor
from tests.searcher.driver.test_driver_parts import _ctx
from trials.coordination.allocations import ClaimedPlacement
from trials.scheduler import Agent, ResourcePool

THREE_SLOTS = ResourcePool("default", (Agent("a0", "127.0.0.1", (0, 1, 2)),))


def _placed_three(
    db_url: str, tmp_path: Path
) -> tuple[PendingQueue, RunningTrials, TellQueue, list[int]]:
    """Three QUEUED 1-slot trials of a live driver, each placed on a slot of its own."""
    experiment_id, trial_ids = add_experiment(
        db_url,
        [{"state": TrialState.QUEUED, "hparams": {"global_batch_size": 64}}] * 3,
    )
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment_id)
        assert row is not None
        row.driver_heartbeat_at = utcnow()
    ctx = replace(
        _ctx(experiment_id=experiment_id),
        db_url=db_url,
        pool=THREE_SLOTS,
        executor=_RecordingExecutor(),
        run_dir=tmp_path,
    )
    pending, tells = PendingQueue(ctx), TellQueue()
    running = RunningTrials(ctx, Outcomes(ctx, tells, Control()))
    with session_scope(db_url) as session:
        for trial_id in trial_ids:
            trial = session.get(Trial, trial_id)
            assert trial is not None
            pending.queue(trial)
    return pending, running, tells, trial_ids


def _failing_start(failures: dict[int, Exception]) -> object:
    def start(trial_id: int, placement: ClaimedPlacement | None) -> object:
        raise failures[trial_id]

    return start


def test_placement_returns_the_claimed_placements_in_order_and_takes_them_off_the_queue(
    db_url: str, tmp_path: Path
) -> None:
    pending, _, _, (a, b, c) = _placed_three(db_url, tmp_path)
    placed = pending.place()
    assert [(each.trial_id, each.slots) for each in placed] == [(a, 1), (b, 1), (c, 1)]
    assert all(each.placement is not None for each in placed)
    assert len(pending) == 0
    assert sorted(_holders(db_url).values()) == [a, b, c]


def test_a_launch_that_failed_is_settled_and_the_next_placement_still_launches(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pending, running, tells, (a, b, c) = _placed_three(db_url, tmp_path)
    waits = EarlierAttemptRunning("trial 1.1 waits: attempt 0 still has processes")
    failures = {a: RuntimeError("no such\nentrypoint"), b: waits, c: RuntimeError("later")}
    monkeypatch.setattr(running.starter, "start", _failing_start(failures))
    control = Control()
    with caplog.at_level(logging.WARNING, logger="searcher.driver.driver"):
        apply_decisions(running.launch(pending.place()), pending, control)
    # A failed (one line, its slots back), B waits (its slots back meanwhile), C was tried.
    assert "trial 1.0 failed: launch failed: no such entrypoint" in caplog.text
    assert "trial 1.1 waits: attempt 0 still has processes" in caplog.text
    assert "launch failed: later" in caplog.text
    assert len(pending) == 1 and pending.sizes() == {1} and len(running) == 0
    assert _holders(db_url) == {}
    with session_scope(db_url) as session:
        failed, waiting = session.get(Trial, a), session.get(Trial, b)
        assert failed is not None and waiting is not None
        assert failed.state == TrialState.ERROR
        assert failed.error == "launch failed: no such entrypoint"
        assert waiting.state == TrialState.QUEUED and waiting.error is None
    assert [state for _, _, state in tells.queued] == [optuna.trial.TrialState.FAIL] * 2


def test_a_transient_error_stops_the_launches_and_gives_the_later_claims_back(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pending, running, _, (a, b, c) = _placed_three(db_url, tmp_path)
    failures: dict[int, Exception] = {
        a: EarlierAttemptRunning("trial 1.0 waits"),
        b: sqlite3.OperationalError("database is locked"),
    }
    monkeypatch.setattr(running.starter, "start", _failing_start(failures))
    with pytest.raises(sqlite3.OperationalError):
        running.launch(pending.place())
    # B keeps the claim it was placed with (the next decision places it again); C,
    # never tried, gives its claim back. All three wait again once the tick is retried.
    assert list(_holders(db_url).values()) == [b]
    assert running.take_decisions() == [
        Requeue(trial_id=a, slots=1),
        Requeue(trial_id=b, slots=1),
        Requeue(trial_id=c, slots=1),
    ]


def test_a_trial_whose_reserved_warm_job_this_driver_does_not_run_waits_for_it_to_end(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pending, running, _, (a, b, c) = _placed_three(db_url, tmp_path)
    with session_scope(db_url) as session:
        trial = session.get(Trial, a)
        assert trial is not None
        job = WarmJob(
            experiment_id=trial.experiment_id,
            resource_pool=THREE_SLOTS.name,
            slots=1,
            placement=[],
            launch_token="t-left",
            reserved_trial_id=a,
        )
        session.add(job)
        session.flush()
        job_id = job.id
    later = {b: EarlierAttemptRunning("b waits"), c: EarlierAttemptRunning("c waits")}
    monkeypatch.setattr(running.starter, "start", _failing_start(later))
    with caplog.at_level(logging.WARNING, logger="searcher.driver.driver"):
        decisions = running.launch(pending.place())
    assert f"trial {a} waits: the warm job reserved for it is ending" in caplog.text
    assert decisions[0] == Requeue(trial_id=a, slots=1) and len(running) == 0
    assert a not in _holders(db_url).values()
    with session_scope(db_url) as session:
        asked = session.get(WarmJob, job_id)
        assert asked is not None and asked.end_reason == "its driver does not run it"


def test_the_driver_waits_a_moment_at_most_for_the_ranks_of_a_handed_over_trial(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "At once" is told from "after the bound" with a bound of a minute: returning within
    # half of it cannot be a wait for the bound, however loaded the machine, and no
    # bound on a duration of its own is asserted. The bounded wait itself is measured
    # with a bound of 0.5 s (longer than the driver's 0.1 s, so it is not mistaken for
    # a loaded machine's delays).

    def at_once() -> None:
        monkeypatch.setattr("searcher.driver.warm._HAND_OVER_WAIT_S", 60.0)

    experiment_id, (trial_id,) = add_experiment(
        db_url, [{"state": TrialState.RUNNING, "hparams": {"global_batch_size": 64}}]
    )
    ctx = replace(_ctx(experiment_id=experiment_id), db_url=db_url, run_dir=tmp_path)
    with session_scope(db_url) as session:
        taken = TrialRun(trial_id=trial_id, attempt=0, ranks_started_at=utcnow())
        not_taken = TrialRun(trial_id=trial_id, attempt=1)
        session.add_all([taken, not_taken])
        session.flush()
        taken_id, not_taken_id = taken.id, not_taken.id
    warm = IdleWarmJobs(ctx)
    for job_id in (1, 2):
        warm.add(IdleJob(job_id=job_id, job=SimpleNamespace(), slots=1, log_path=tmp_path))
    # The ranks took it: the tick goes on at once.
    at_once()
    warm.take(1, handed_run_id=taken_id)
    began = time.monotonic()
    assert warm.await_taken() is False
    assert time.monotonic() - began < 30.0
    # Ranks that do not take theirs hold the tick back no longer than the bound, once.
    monkeypatch.setattr("searcher.driver.warm._HAND_OVER_WAIT_S", 0.5)
    warm.take(2, handed_run_id=not_taken_id)
    began = time.monotonic()
    assert warm.await_taken() is False
    assert 0.5 <= time.monotonic() - began < 30.0
    at_once()
    began = time.monotonic()
    assert warm.await_taken() is False  # nothing handed over since: nothing to wait for
    assert time.monotonic() - began < 30.0
    # Another warm job handed its trial back meanwhile: the tick ends at once, for it.
    with session_scope(db_url) as session:
        session.add(
            WarmJob(
                experiment_id=experiment_id,
                resource_pool="default",
                slots=1,
                placement=[],
                launch_token="t-handed-back",
            )
        )
    warm.add(IdleJob(job_id=3, job=SimpleNamespace(), slots=1, log_path=tmp_path))
    warm.take(3, handed_run_id=not_taken_id)
    began = time.monotonic()
    assert warm.await_taken() is True
    assert time.monotonic() - began < 30.0
