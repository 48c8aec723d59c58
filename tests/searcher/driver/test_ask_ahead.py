"""Trials asked ahead of their slots: never past the count, never left RUNNING, never a failure.

With warm workers the driver asks each warm job's next trial while the current one
runs (:meth:`searcher.driver.study_side.StudySide.fill_queue` with ``ahead``), so that the
hand-over does not wait for the sampler. Such a trial waits in the driver's pending
queue, out of the cluster's queue, until a running trial ends
(:meth:`searcher.driver.placement.PendingQueue.place` with ``room``). Here, on a real Optuna
study in a SQLite file and without processes: the count is never passed; a kill ends a
trial that never started as NOT_RUN (Optuna hears FAIL, the search counts no failure);
a pause keeps it for the resume; and a resume after a crash between the ask and the
launch queues each asked trial once, the one whose row was never written included.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from sqlalchemy import delete, select

import searcher.submit.space as space
from searcher.diagnose.consistency import check_consistency
from searcher.driver.context import DriverContext
from searcher.driver.control import Control, claim_ownership, finish
from searcher.driver.decisions import Requeue, apply_decisions
from searcher.driver.driver import SearchDriver
from searcher.driver.handoff import AheadReservations, RunningJob, Started
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import PendingQueue, Placed
from searcher.driver.running import RunningTrials, _Running
from searcher.driver.runtime_spec import build_runtime_spec
from searcher.driver.study_side import StudySide, TellQueue
from searcher.submit.creation import create_experiment
from storage import (
    Allocation,
    Experiment,
    ExperimentState,
    ProcessRole,
    QueuedTrial,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    WarmJob,
    session_scope,
    study_trials,
    upgrade_schema,
    utcnow,
)
from tests.conftest import EXAMPLES_DIR, POSTGRESQL, add_experiment
from trials.config import ExperimentConfig, parse_config
from trials.coordination import cluster_queue, warm_jobs
from trials.coordination.attempts import request_stop
from trials.executors import LocalExecutor
from trials.launch.processes import ProcessRef
from trials.queries import trial_counts, trial_total
from trials.runtime import DistributedInfo, WarmChannel
from trials.scheduler import Agent, ResourcePool
from trials.timings import Timings

ONE_SLOT = ResourcePool("default", (Agent("local", "127.0.0.1", (0,)),))


@pytest.fixture
def config() -> ExperimentConfig:
    """The digits example on warm 1-slot jobs, one at a time, three trials in all."""
    return _digits(max_trials=3)


def _digits(*, max_trials: int) -> ExperimentConfig:
    raw = yaml.safe_load((EXAMPLES_DIR / "digits" / "experiment.yaml").read_text())
    raw["searcher"].update(max_trials=max_trials, max_concurrent_trials=1)
    raw["resources"] = {"slots_per_trial": 1, "reuse_workers": True}
    return parse_config(raw)


@pytest.fixture
def ctx(db_url: str, config: ExperimentConfig, tmp_path: Path) -> DriverContext:
    """The driver's view of a new experiment (its study created) on one slot."""
    return _new_experiment(db_url, config, tmp_path)


def _new_experiment(db_url: str, config: ExperimentConfig, tmp_path: Path) -> DriverContext:
    experiment_id = create_experiment(
        config,
        config_path=None,
        db_url=db_url,
        directions=["minimize"],
        model_dir=EXAMPLES_DIR / "digits",
    )
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        checkpoint_folder = experiment.checkpoint_folder
    ctx = DriverContext(
        db_url=db_url,
        experiment_id=experiment_id,
        study_name=f"{config.name}-{experiment_id}",
        model_dir=EXAMPLES_DIR / "digits",
        config=config,
        pool=ONE_SLOT,
        executor=LocalExecutor(use_gpus=False),
        run_dir=tmp_path / "logs",
        timings=Timings(),
        checkpoint_folder=checkpoint_folder,
    )
    claim_ownership(ctx)  # the cluster's queue takes only trials of a driven experiment
    return ctx


def _start(ctx: DriverContext, trial_id: int) -> None:
    """Mark the trial launched (its processes are not these tests' business)."""
    with session_scope(ctx.db_url) as session:
        row = session.get(Trial, trial_id)
        assert row is not None
        row.state = TrialState.RUNNING


def _one_running_and_one_ahead(ctx: DriverContext) -> tuple[StudySide, PendingQueue, TellQueue]:
    """Trial 0 runs on a warm job; trial 1 was asked ahead for it and waits."""
    tells = TellQueue()
    study = StudySide.load(ctx, trials_so_far=0, tells=tells)
    pending = PendingQueue(ctx)
    study.fill_queue(0, pending)
    (first,) = pending.place(room=1)
    _start(ctx, first.trial_id)
    study.fill_queue(1, pending, ahead=1)
    return study, pending, tells


def _states(ctx: DriverContext) -> dict[int, TrialState]:
    with session_scope(ctx.db_url) as session:
        return dict(
            session.execute(
                select(Trial.optuna_trial_number, Trial.state).where(
                    Trial.experiment_id == ctx.experiment_id
                )
            ).all()
        )


def _optuna_states(ctx: DriverContext) -> dict[int, str]:
    return {t.number: t.state.name for t in study_trials(ctx.db_url, ctx.study_name) or []}


def test_a_trial_asked_ahead_waits_out_of_the_clusters_queue_and_the_count_is_never_passed(
    ctx: DriverContext,
) -> None:
    study, pending, _ = _one_running_and_one_ahead(ctx)
    assert len(pending) == 1
    # No room while trial 0 runs: the trial asked ahead is offered to no decision.
    assert pending.place(room=0) == []
    with session_scope(ctx.db_url) as session:
        assert session.scalars(select(QueuedTrial)).all() == []
        # What the count is read from: every row, whatever its state.
        assert trial_total(session, ctx.experiment_id) == 2
    # However many it may ask ahead, the driver asks no trial past max_trials (3).
    study.fill_queue(1, pending, ahead=10)
    assert len(pending) == 2
    assert sorted(_states(ctx)) == [0, 1, 2]
    assert sorted(_optuna_states(ctx)) == [0, 1, 2]


def _end_with_one_ahead(ctx: DriverContext, state: ExperimentState) -> None:
    """End the experiment in ``state`` while trial 0 runs and trial 1 waits asked ahead."""
    study, _, tells = _one_running_and_one_ahead(ctx)
    control = Control()
    outcomes = Outcomes(ctx, tells, control)
    finish(ctx, state, control, outcomes.fail, outcomes.not_run)
    study.flush_tells()


def test_a_kill_ends_a_trial_asked_ahead_as_not_run_and_no_failure(ctx: DriverContext) -> None:
    _end_with_one_ahead(ctx, ExperimentState.CANCELED)

    assert _states(ctx)[1] == TrialState.NOT_RUN
    with session_scope(ctx.db_url) as session:
        counts = trial_counts(session, ctx.experiment_id)
        ahead_id, error = session.execute(
            select(Trial.id, Trial.error).where(Trial.optuna_trial_number == 1)
        ).one()
    assert (counts.not_run, counts.errored) == (1, 0)
    assert error == "experiment killed before the trial ran"
    assert _optuna_states(ctx)[1] == "FAIL"  # not left RUNNING there
    # Optuna's FAIL is what NOT_RUN maps to: the database and the study agree on it.
    problems = check_consistency(ctx.db_url, [ctx.experiment_id]).problems
    assert not [line for line in problems if line.startswith(f"trial {ahead_id}:")]


def test_a_pause_keeps_a_trial_asked_ahead_for_the_resume(ctx: DriverContext) -> None:
    _end_with_one_ahead(ctx, ExperimentState.PAUSED)

    assert _states(ctx)[1] == TrialState.QUEUED
    with session_scope(ctx.db_url) as session:
        assert trial_counts(session, ctx.experiment_id).errored == 0


def _resumed_driver(ctx: DriverContext, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A new driver of the experiment, recovered from the database as ``run`` recovers it."""
    monkeypatch.setenv("SLOTSWEEP_LOG_DIR", str(ctx.run_dir))
    run = SimpleNamespace(
        db_url=ctx.db_url,
        config=ctx.config,
        pool=ctx.pool,
        executor=ctx.executor,
        cluster=SimpleNamespace(notifications=()),
    )
    driver = SearchDriver(ctx.experiment_id, run)  # type: ignore[arg-type]
    driver._study = StudySide.load(driver.ctx, trials_so_far=2, tells=driver._tells)
    driver._recover(driver._study)
    return driver


def test_a_resume_after_a_crash_between_ask_ahead_and_launch_queues_each_trial_once(
    ctx: DriverContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    study, _, _ = _one_running_and_one_ahead(ctx)
    # The driver dies having asked trial 2 ahead too (all its values drawn), before its
    # row was written.
    space.suggest_hparams(study.study.ask(), ctx.config.hyperparameters)

    driver = _resumed_driver(ctx, monkeypatch)
    pending = driver._pending
    # Each asked trial waits once: the one that ran, the one asked ahead, the adopted one.
    assert sorted(_states(ctx).items()) == [(n, TrialState.QUEUED) for n in (0, 1, 2)]
    assert len(pending) == 3
    # The count is reached: the resumed search asks nothing more, ahead or not.
    driver._study.fill_queue(0, pending, ahead=1)
    assert len(pending) == 3
    assert _optuna_states(ctx) == {0: "RUNNING", 1: "RUNNING", 2: "RUNNING"}
    # One runs at a time, oldest first; the others wait out of the cluster's queue.
    with session_scope(ctx.db_url) as session:
        first = session.scalar(select(Trial.id).where(Trial.optuna_trial_number == 0))
    assert [p.trial_id for p in pending.place(room=1)] == [first]
    assert len(pending) == 2


def test_a_resume_does_not_say_a_trial_that_ended_while_no_driver_watched_goes_on(
    ctx: DriverContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_running_and_one_ahead(ctx)
    # Trial 0's ranks reported it pruned 40 s after they started; its driver died
    # before ending its run (and before timing it).
    pruned_at = utcnow() - dt.timedelta(seconds=60)
    with session_scope(ctx.db_url) as session:
        trial = session.scalars(select(Trial).where(Trial.optuna_trial_number == 0)).one()
        trial.pruned_at = pruned_at
        slots = trial.slots_per_trial
        session.add(
            TrialRun(
                trial_id=trial.id,
                attempt=0,
                executor="local",
                agents=[],
                ranks_started_at=pruned_at - dt.timedelta(seconds=40),
                progress_at=pruned_at,
            )
        )

    _resumed_driver(ctx, monkeypatch)
    with session_scope(ctx.db_url) as session:
        trial = session.scalars(select(Trial).where(Trial.optuna_trial_number == 0)).one()
        (run,) = trial.runs
        assert trial.state == TrialState.PRUNED
        assert run.ended_at is not None
        assert run.reason == "driver stopped after the trial had ended"
        # Its compute up to its end is counted, not the minute no driver watched.
        assert trial.slot_seconds == pytest.approx(40.0 * slots)


# ----------------------------------------------------------------- decided ahead
# The driver also decides the trial asked ahead as its warm job's next one; rank 0
# starts it in its hand-back's transaction while that decision stands.


def _decided_ahead(ctx: DriverContext) -> tuple[PendingQueue, AheadReservations, int, int, int]:
    """Trial 0 runs on warm job J; trial 1, asked ahead, is decided as J's next.

    Returns the pending queue, the reservations, J, and the ids of trials 0 and 1.
    """
    warm = _warm_job_deciding_ahead(ctx, depth=1)
    return warm.pending, warm.ahead, warm.job_id, *warm.trials


@dataclass
class _WarmJob:
    """A warm job running a search's first trial, and the trials decided ahead for it."""

    study: StudySide
    pending: PendingQueue
    ahead: AheadReservations
    job_id: int
    #: The ids of the trial it runs and of those decided ahead, in order.
    trials: list[int]


def _warm_job_deciding_ahead(ctx: DriverContext, *, depth: int) -> _WarmJob:
    """Trial 0 runs on warm job J; ``depth`` trials asked ahead are decided as J's next ones."""
    study = StudySide.load(ctx, trials_so_far=0, tells=TellQueue())
    pending = PendingQueue(ctx)
    study.fill_queue(0, pending)
    (first,) = pending.place(room=1)
    job_id = _open_warm_job(ctx, first)
    study.fill_queue(1, pending, ahead=depth)
    ahead = AheadReservations(ctx)
    ahead.reserve([RunningJob(job_id, slots=1, trial_id=first.trial_id)], pending)
    return _WarmJob(study, pending, ahead, job_id, sorted(_trial_ids(ctx)))


def _open_warm_job(ctx: DriverContext, placed: Placed) -> int:
    """Start the placed trial as the first on a new warm job (no processes); the job's id."""
    assert placed.placement is not None
    with session_scope(ctx.db_url) as session:
        run = TrialRun(
            trial_id=placed.trial_id,
            attempt=0,
            executor="local",
            agents=[{"agent": "local", "host": "127.0.0.1", "slots": [0]}],
            launch_token=f"warm-job-token-{placed.trial_id}",
            claim_token=placed.placement.token,
        )
        session.add(run)
        session.flush()
        job_id = warm_jobs.open_job(
            session, run, placed.placement, experiment_id=ctx.experiment_id
        )
    _start(ctx, placed.trial_id)
    return job_id


def _trial_ids(ctx: DriverContext) -> list[int]:
    with session_scope(ctx.db_url) as session:
        return list(
            session.scalars(select(Trial.id).where(Trial.experiment_id == ctx.experiment_id))
        )


def _hand_back(ctx: DriverContext, job_id: int, trial_id: int) -> tuple[bool, str | None]:
    """What rank 0 of the job does once trial ``trial_id`` finished on it (one transaction)."""
    with session_scope(ctx.db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        spec = build_runtime_spec(ctx, trial, 0, None, warm_job_id=job_id)
    return WarmChannel(spec, DistributedInfo()).hand_back(trial_id)


def _job(ctx: DriverContext, job_id: int) -> WarmJob:
    with session_scope(ctx.db_url) as session:
        job = session.get(WarmJob, job_id)
        assert job is not None
        session.expunge(job)
    return job


@pytest.mark.parametrize("database", ["sqlite", POSTGRESQL])
def test_rank_0_starts_the_trial_decided_ahead_in_its_hand_back(
    request: pytest.FixtureRequest,
    db_url: str,
    config: ExperimentConfig,
    tmp_path: Path,
    database: str,
) -> None:
    if database == "postgresql":
        db_url = request.getfixturevalue("postgres_url")
        upgrade_schema(db_url)
    ctx = _new_experiment(db_url, config, tmp_path)
    pending, ahead, job_id, first, second = _decided_ahead(ctx)
    # Out of the pending queue: no placement decision can start it elsewhere.
    assert len(pending) == 0 and len(ahead) == 1
    assert _job(ctx, job_id).ahead_trial_id == second
    me = ProcessRef.of(os.getpid())
    with session_scope(ctx.db_url) as session:
        (first_run,) = session.scalars(select(TrialRun).where(TrialRun.trial_id == first))
        session.add(
            TrialProcess(
                run_id=first_run.id,
                trial_id=first,
                attempt=0,
                role=ProcessRole.TORCHRUN,
                agent="local",
                host=me.host,
                slots=[0],
                pid=me.pid,
                create_time=me.create_time,
            )
        )

    staying, started = _hand_back(ctx, job_id, first)

    assert staying and started is not None and json.loads(started)["trial_id"] == second
    job = _job(ctx, job_id)
    with session_scope(ctx.db_url) as session:
        (run,) = session.scalars(select(TrialRun).where(TrialRun.trial_id == second))
        trial = session.get(Trial, second)
        assert trial is not None and trial.state == TrialState.RUNNING
        # The rows the driver's hand-over writes: the run on the job's token, fenced
        # and started, the slots under its claim, the job's torchrun under it.
        assert (run.attempt, run.launch_token) == (0, f"warm-job-token-{first}")
        assert run.ranks_started_at is not None and run.spec == json.loads(started)
        tokens = set(session.scalars(select(Allocation.claim_token)))
        owners = set(session.scalars(select(Allocation.trial_id)))
        assert tokens == {run.claim_token} and owners == {second}
        processes = session.execute(
            select(TrialProcess.run_id, TrialProcess.pid, TrialProcess.ended_at)
        ).all()
        assert {(p.run_id, p.pid, p.ended_at is None) for p in processes} == {
            (first_run.id, me.pid, False),
            (run.id, me.pid, True),
        }
    assert (job.current_trial_id, job.current_run_id) == (second, run.id)
    assert job.ahead_trial_id is None and job.trials_run == 1
    # The driver sees it started, and takes it over.
    (settled,) = ahead.settle(job_id)
    assert isinstance(settled, Started)
    assert (settled.reservation.trial_id, settled.run_id) == (second, run.id)
    assert len(ahead) == 0


def _another_search_waits_first(ctx: DriverContext) -> None:
    """A search of priority 1 (over this one's 42) queues a trial in the same pool."""
    other_id, (other_trial,) = add_experiment(
        ctx.db_url, [{"state": TrialState.QUEUED, "slots_per_trial": 1}], name="urgent"
    )
    with session_scope(ctx.db_url) as session:
        other = session.get(Experiment, other_id)
        assert other is not None
        other.driver_heartbeat_at = utcnow()  # a live driver's (a dead one's queue is dropped)
        cluster_queue.enqueue(
            session,
            [cluster_queue.QueueEntry(other_trial, other_id, ctx.pool.name, 1, priority=1)],
        )


def _pause_requested(ctx: DriverContext) -> None:
    with session_scope(ctx.db_url) as session:
        experiment = session.get(Experiment, ctx.experiment_id)
        assert experiment is not None
        experiment.requested_action = "pause"


def _trial_asked_to_stop(ctx: DriverContext) -> None:
    """The running trial was asked to checkpoint and stop (a pause, a preemption)."""
    with session_scope(ctx.db_url) as session:
        for run in session.scalars(select(TrialRun)):
            request_stop(session, run)


def _slots_reclaimed(ctx: DriverContext) -> None:
    """The ledger lost the job's slot (a driver judged the job gone and freed it)."""
    with session_scope(ctx.db_url) as session:
        session.execute(delete(Allocation))


@pytest.mark.parametrize(
    "moved",
    [_another_search_waits_first, _pause_requested, _trial_asked_to_stop, _slots_reclaimed],
    ids=[
        "higher-priority-trial-of-another-search",
        "pause-requested",
        "trial-asked-to-stop",
        "slots-reclaimed",
    ],
)
def test_rank_0_hands_back_when_the_decision_no_longer_stands(
    ctx: DriverContext, moved: Any
) -> None:
    pending, ahead, job_id, first, second = _decided_ahead(ctx)
    moved(ctx)

    assert _hand_back(ctx, job_id, first) == (True, None)

    job = _job(ctx, job_id)
    assert job.current_trial_id is None and job.ahead_trial_id is None and job.ahead is None
    with session_scope(ctx.db_url) as session:
        assert not session.scalars(select(TrialRun).where(TrialRun.trial_id == second)).all()
    # The driver sees the job idle: the trial waits for the queue's decision again.
    assert ahead.settle(job_id) == [Requeue(trial_id=second, slots=1)]
    apply_decisions([Requeue(trial_id=second, slots=1)], pending, Control())
    assert pending.first_of_size(1) == second


def test_a_pause_withdraws_the_decision_before_the_hand_back(ctx: DriverContext) -> None:
    _, ahead, job_id, first, second = _decided_ahead(ctx)
    assert ahead.withdraw(job_id) == [Requeue(trial_id=second, slots=1)]
    assert _job(ctx, job_id).ahead_trial_id is None
    # Rank 0 comes too late: the job is idle and the trial never started.
    assert _hand_back(ctx, job_id, first) == (True, None)
    assert _states(ctx)[1] == TrialState.QUEUED


def test_a_withdrawal_after_rank_0_started_the_trial_leaves_it_to_adopt(
    ctx: DriverContext,
) -> None:
    _, ahead, job_id, first, second = _decided_ahead(ctx)
    staying, started = _hand_back(ctx, job_id, first)
    assert staying and started is not None
    # Too late to withdraw: it runs, and the driver adopts (then stops) it.
    (settled,) = ahead.withdraw(job_id)
    assert isinstance(settled, Started) and settled.reservation.trial_id == second


@pytest.mark.parametrize("started", [False, True], ids=["before-the-start", "after-the-start"])
def test_a_resume_after_a_kill_of_the_driver_runs_the_trial_decided_ahead_once(
    ctx: DriverContext, monkeypatch: pytest.MonkeyPatch, started: bool
) -> None:
    _, _, job_id, first, second = _decided_ahead(ctx)
    with session_scope(ctx.db_url) as session:
        trial = session.get(Trial, first)
        assert trial is not None
        # Its ranks recorded its end.
        trial.finished_at, trial.searcher_metric_value = utcnow(), 0.1
    if started:
        assert _hand_back(ctx, job_id, first)[1] is not None

    # The driver is killed here (its processes are gone: this test started none).
    driver = _resumed_driver(ctx, monkeypatch)

    job = _job(ctx, job_id)
    assert job.ended_at is not None and job.ahead_trial_id is None
    # A rank 0 that outlived its driver can no longer start anything on the job.
    assert _hand_back(ctx, job_id, first if not started else second) == (False, None)
    with session_scope(ctx.db_url) as session:
        finished = session.get(Trial, first)
        assert finished is not None and finished.state == TrialState.COMPLETED
        runs = session.scalars(select(TrialRun).where(TrialRun.trial_id == second)).all()
        assert all(run.ended_at is not None for run in runs) and len(runs) == int(started)
    # The trial decided ahead waits once, to run again from its start.
    assert _states(ctx)[1] == TrialState.QUEUED
    assert [p.trial_id for p in driver._pending.place(room=2)] == [second]


# ----------------------------------------------------------------- two decided ahead
# The driver keeps two trials decided ahead per warm job: a short trial may end before
# the driver has adopted the one before it and decided another.


def _ahead_on_row(ctx: DriverContext, job_id: int) -> list[int]:
    """The trials decided ahead on the job's row, in order (the first one's id checked)."""
    job = _job(ctx, job_id)
    chain = [start["trial_id"] for start in job.ahead or ()]
    assert job.ahead_trial_id == (chain[0] if chain else None)
    return chain


def _finished(ctx: DriverContext, trial_id: int) -> None:
    """Rank 0 recorded the trial's end (its last validation, then its finish)."""
    with session_scope(ctx.db_url) as session:
        trial = session.get(Trial, trial_id)
        assert trial is not None
        trial.finished_at, trial.searcher_metric_value = utcnow(), 0.1


def _run_of(ctx: DriverContext, trial_id: int) -> TrialRun:
    with session_scope(ctx.db_url) as session:
        (run,) = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial_id))
        session.expunge(run)
    return run


@pytest.mark.parametrize("database", ["sqlite", POSTGRESQL])
def test_rank_0_takes_the_first_of_two_decided_ahead_and_the_second_moves_up(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path, database: str
) -> None:
    if database == "postgresql":
        db_url = request.getfixturevalue("postgres_url")
        upgrade_schema(db_url)
    ctx = _new_experiment(db_url, _digits(max_trials=4), tmp_path)
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    first, second, third = warm.trials
    assert len(warm.pending) == 0 and len(warm.ahead) == 2
    assert _ahead_on_row(ctx, warm.job_id) == [second, third]

    staying, started = _hand_back(ctx, warm.job_id, first)

    assert staying and started is not None and json.loads(started)["trial_id"] == second
    assert _ahead_on_row(ctx, warm.job_id) == [third]
    assert _states(ctx) == {0: TrialState.RUNNING, 1: TrialState.RUNNING, 2: TrialState.QUEUED}
    with session_scope(ctx.db_url) as session:
        # The job's slot is the started trial's alone.
        assert set(session.scalars(select(Allocation.trial_id))) == {second}
    # The driver adopts it; the third stays decided ahead.
    (settled,) = warm.ahead.settle(warm.job_id)
    run = _run_of(ctx, second)
    assert settled == Started(settled.reservation, run.id, job_run_id=run.id)
    assert settled.reservation.trial_id == second and len(warm.ahead) == 1
    # And decides the next one at once: two are ready again.
    warm.study.fill_queue(1 + len(warm.ahead), warm.pending, ahead=2)
    (fourth,) = [t for t in _trial_ids(ctx) if t not in warm.trials]
    warm.ahead.reserve([RunningJob(warm.job_id, slots=1, trial_id=second)], warm.pending)
    assert _ahead_on_row(ctx, warm.job_id) == [third, fourth] and len(warm.ahead) == 2


def test_the_next_trial_is_decided_ahead_behind_one_that_rank_0_took_before_the_driver_looked(
    ctx: DriverContext,
) -> None:
    warm = _warm_job_deciding_ahead(ctx, depth=1)
    first, second = warm.trials
    assert _hand_back(ctx, warm.job_id, first)[1] is not None
    # The driver has not seen that hand-back yet: it decides the third behind the second.
    warm.study.fill_queue(1 + len(warm.ahead), warm.pending, ahead=2)
    (third,) = [t for t in _trial_ids(ctx) if t not in warm.trials]
    warm.ahead.reserve([RunningJob(warm.job_id, slots=1, trial_id=first)], warm.pending)
    assert _ahead_on_row(ctx, warm.job_id) == [third] and len(warm.ahead) == 2

    (settled,) = warm.ahead.settle(warm.job_id)
    assert isinstance(settled, Started) and settled.reservation.trial_id == second
    assert _hand_back(ctx, warm.job_id, second)[1] is not None
    assert _states(ctx)[2] == TrialState.RUNNING


def _running_trials(ctx: DriverContext, warm: _WarmJob) -> tuple[RunningTrials, _Job]:
    """The driver's running attempts: the warm job's first trial, with ``warm``'s reservations."""
    running = RunningTrials(ctx, Outcomes(ctx, TellQueue(), Control()))
    running.ahead = warm.ahead
    first = warm.trials[0]
    job = _Job()
    running._running[first] = _Running(
        trial_id=first,
        optuna_number=0,
        attempt=0,
        slots=1,
        job=job,
        started=0.0,
        run_id=_run_of(ctx, first).id,
        warm_job_id=warm.job_id,
    )
    return running, job


class _Job:
    """The warm job's processes, which run on (this test starts none)."""

    def poll(self) -> int | None:
        return None

    def end(self, *, grace_s: float) -> bool:
        return True


def test_the_driver_adopts_both_trials_rank_0_started_before_it_looked(
    ctx: DriverContext,
) -> None:
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    first, second, third = warm.trials
    running, _ = _running_trials(ctx, warm)
    # Two short trials: the second ended, and rank 0 started the third, before the
    # driver looked at the job once.
    _finished(ctx, first)
    assert _hand_back(ctx, warm.job_id, first)[1] is not None
    _finished(ctx, second)
    assert _hand_back(ctx, warm.job_id, second)[1] is not None

    assert running.reap() == []

    # Both are adopted in order: each ended the one before it on the job.
    assert set(running._running) == {third} and len(running) == 1
    assert running._running[third].run_id == _run_of(ctx, third).id
    assert _states(ctx) == {
        0: TrialState.COMPLETED,
        1: TrialState.COMPLETED,
        2: TrialState.RUNNING,
    }
    assert _run_of(ctx, first).ended_at is not None and _run_of(ctx, second).ended_at is not None
    assert _run_of(ctx, third).ended_at is None
    assert not running.has_warm_jobs and len(running.ahead) == 0


def test_a_refusal_puts_both_trials_decided_ahead_back_in_the_queue(ctx: DriverContext) -> None:
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    first, second, third = warm.trials
    _another_search_waits_first(ctx)

    assert _hand_back(ctx, warm.job_id, first) == (True, None)

    assert _ahead_on_row(ctx, warm.job_id) == []
    assert warm.ahead.settle(warm.job_id) == [
        Requeue(trial_id=second, slots=1),
        Requeue(trial_id=third, slots=1),
    ]
    assert len(warm.ahead) == 0
    assert _states(ctx) == {0: TrialState.RUNNING, 1: TrialState.QUEUED, 2: TrialState.QUEUED}


@pytest.mark.parametrize("taken", [0, 1], ids=["none-taken", "first-taken"])
def test_a_pause_withdraws_both_trials_decided_ahead(ctx: DriverContext, taken: int) -> None:
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    first, second, third = warm.trials
    running, _ = _running_trials(ctx, warm)
    if taken:
        _finished(ctx, first)
        assert _hand_back(ctx, warm.job_id, first)[1] is not None

    running.preempt()

    assert _ahead_on_row(ctx, warm.job_id) == [] and len(running.ahead) == 0
    # What rank 0 took first is adopted and asked to stop; the rest waits for the resume.
    assert running.take_decisions() == [
        Requeue(trial_id=trial_id, slots=1) for trial_id in (second, third)[taken:]
    ]
    (asked,) = running._running
    assert asked == (second if taken else first)
    assert _run_of(ctx, asked).stop_requested_at is not None
    # Rank 0 can start neither now.
    assert _hand_back(ctx, warm.job_id, asked) == (True, None)
    assert _states(ctx)[2] == TrialState.QUEUED


@pytest.mark.parametrize("taken", [0, 1, 2], ids=["none-taken", "first-taken", "both-taken"])
def test_a_resume_after_a_driver_kill_with_two_decided_ahead_runs_each_once(
    ctx: DriverContext, monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    for before in warm.trials[:taken]:
        _finished(ctx, before)
        assert _hand_back(ctx, warm.job_id, before)[1] is not None
    _finished(ctx, warm.trials[taken])

    # The driver is killed here (its processes are gone: this test started none).
    driver = _resumed_driver(ctx, monkeypatch)

    job = _job(ctx, warm.job_id)
    assert job.ended_at is not None and _ahead_on_row(ctx, warm.job_id) == []
    # A rank 0 that outlived its driver can no longer start anything on the job.
    assert _hand_back(ctx, warm.job_id, warm.trials[taken]) == (False, None)
    with session_scope(ctx.db_url) as session:
        runs = session.execute(select(TrialRun.trial_id, TrialRun.ended_at)).all()
    assert sorted(trial_id for trial_id, _ in runs) == warm.trials[: taken + 1]
    assert all(ended_at is not None for _, ended_at in runs)
    # Every trial that finished stays finished; each other waits once, to run from its start.
    states = _states(ctx)
    assert [states[n] for n in range(taken + 1)] == [TrialState.COMPLETED] * (taken + 1)
    assert [states[n] for n in range(taken + 1, 3)] == [TrialState.QUEUED] * (2 - taken)
    assert len(driver._pending) == 2 - taken
    waiting = warm.trials[taken + 1 : taken + 2]  # oldest first, on the one slot
    assert [p.trial_id for p in driver._pending.place(room=1)] == waiting


def test_an_idle_job_takes_over_the_second_trial_decided_ahead_for_a_busy_one(
    ctx: DriverContext,
) -> None:
    # The search's end: nothing else waits. Rather than end, an idle job runs the trial
    # that would wait behind two others on the busy job; that one keeps its next.
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    _, second, third = warm.trials
    assert warm.ahead.share([1]) == [Requeue(trial_id=third, slots=1)]
    assert _ahead_on_row(ctx, warm.job_id) == [second] and len(warm.ahead) == 1
    assert warm.ahead.share([1]) == []


@pytest.mark.parametrize("look", ["reap", "hand-back-seen-at-a-launch"])
def test_a_job_that_ran_both_trials_to_their_end_before_the_driver_looked_is_idle(
    ctx: DriverContext, look: str
) -> None:
    # Seen at the tick's reap, or at a launch: a placement decision reserved the idle
    # job for a trial before this driver's reap saw any of it.
    warm = _warm_job_deciding_ahead(ctx, depth=2)
    running, _ = _running_trials(ctx, warm)
    for trial_id in warm.trials:
        _finished(ctx, trial_id)
        _hand_back(ctx, warm.job_id, trial_id)
    assert _job(ctx, warm.job_id).current_trial_id is None

    if look == "reap":
        assert running.reap() == []
    else:
        running._hand_back_seen(running._running[warm.trials[0]])

    # Each adopted in order and recorded; the job waits idle for this driver.
    assert len(running) == 0 and running.warm.get(warm.job_id) is not None
    assert set(_states(ctx).values()) == {TrialState.COMPLETED}
    assert all(_run_of(ctx, trial_id).ended_at is not None for trial_id in warm.trials)


def test_the_hand_back_commits_with_the_trials_last_records_and_end(ctx: DriverContext) -> None:
    """Rank 0's last metrics, the trial's end and the hand-back (the next trial's start
    included) are one transaction, as the runner writes them on a warm job."""
    import time

    from sqlalchemy import event

    from storage import Metric, get_engine
    from trials.runtime._recorder import ChiefRecorder

    _, _, job_id, first, second = _decided_ahead(ctx)
    with session_scope(ctx.db_url) as session:
        trial = session.get(Trial, first)
        assert trial is not None
        spec = build_runtime_spec(ctx, trial, 0, None, warm_job_id=job_id)
    channel = WarmChannel(spec, DistributedInfo())
    recorder = ChiefRecorder(spec)
    commits: list[object] = []

    def count(connection: object) -> None:
        commits.append(connection)

    engine = get_engine(spec.db_url)
    event.listen(engine, "commit", count)
    try:
        recorder.flush()
        commits.clear()
        # What the runner does once the user's code returned (the thread is busy meanwhile).
        recorder.submit(lambda: time.sleep(0.2))
        recorder.validation_metrics(1, None, {"val_loss": 0.25})
        recorder.finished(1)
        recorder.call_write(channel.hand_back_write(first))
        assert len(commits) == 1
    finally:
        event.remove(engine, "commit", count)
        recorder.close()
    next_spec = channel.next_trial(first)
    assert next_spec is not None and next_spec.trial_id == second
    with session_scope(ctx.db_url) as session:
        finished = session.get(Trial, first)
        assert finished is not None and finished.finished_at is not None
        assert finished.searcher_metric_value == 0.25
        assert session.scalar(select(Metric.value).where(Metric.trial_id == first)) == 0.25
        started = session.get(Trial, second)
        assert started is not None and started.state == TrialState.RUNNING


TWO_SLOTS = ResourcePool("default", (Agent("local", "127.0.0.1", (0, 1)),))


def _two_warm_jobs(
    db_url: str, tmp_path: Path
) -> tuple[DriverContext, StudySide, PendingQueue, list[RunningJob]]:
    """Two warm 1-slot jobs of one search on two slots, each running one of its trials."""
    config = _digits(max_trials=8)
    searcher_config = config.searcher.model_copy(update={"max_concurrent_trials": 2})
    config = config.model_copy(update={"searcher": searcher_config})
    ctx = dataclasses.replace(_new_experiment(db_url, config, tmp_path), pool=TWO_SLOTS)
    study = StudySide.load(ctx, trials_so_far=0, tells=TellQueue())
    pending = PendingQueue(ctx)
    study.fill_queue(0, pending)
    jobs = [
        RunningJob(_open_warm_job(ctx, placed), slots=1, trial_id=placed.trial_id)
        for placed in pending.place(room=2)
    ]
    assert len(jobs) == 2
    return ctx, study, pending, jobs


def test_every_warm_job_gets_its_next_trial_before_any_gets_a_second(
    db_url: str, tmp_path: Path
) -> None:
    # One trial asked ahead goes to the first job; the next one asked to the other job,
    # not behind the first job's: a job whose chain ran dry is served by the next ask.
    ctx, study, pending, (first, second) = _two_warm_jobs(db_url, tmp_path)
    ahead = AheadReservations(ctx)
    assert study.fill_queue(2, pending, ahead=4, most=1) == 1
    ahead.reserve([first, second], pending)
    assert [len(_ahead_on_row(ctx, job.job_id)) for job in (first, second)] == [1, 0]
    assert study.fill_queue(2 + len(ahead), pending, ahead=4, most=1) == 1
    ahead.reserve([first, second], pending)
    assert [len(_ahead_on_row(ctx, job.job_id)) for job in (first, second)] == [1, 1]
    # Asked two at once, the third and fourth go one to each, in the jobs' order.
    assert study.fill_queue(2 + len(ahead), pending, ahead=4) == 2
    ahead.reserve([first, second], pending)
    rows = [_ahead_on_row(ctx, job.job_id) for job in (first, second)]
    assert [len(row) for row in rows] == [2, 2] and not pending
    assert rows[0][1] < rows[1][1]  # the older trial runs first
    assert study.fill_queue(2 + len(ahead), pending, ahead=4) == 0


def test_trials_enqueued_past_the_count_are_asked_one_at_a_time_too(ctx: DriverContext) -> None:
    # `enough` skips reading the trials users enqueued only while the count itself
    # leaves that many: once max_trials is reached, an enqueued trial is still asked.
    study = StudySide.load(ctx, trials_so_far=0, tells=TellQueue())
    pending = PendingQueue(ctx)
    assert study.fill_queue(0, pending, ahead=5) == 3  # max_trials
    study.study.enqueue_trial({"lr": 0.01})
    assert study.trials_left(enough=1) == 1
    assert study.fill_queue(0, pending, ahead=5, most=1) == 1
    assert study.trials_left(enough=1) == 0 and study.search_done()
