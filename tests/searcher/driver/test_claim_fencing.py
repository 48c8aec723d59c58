"""Fenced slot claims, without processes: a driver stopped past its lease starts nothing.

Issue 26: a driver stopped (SIGSTOP, a suspended machine) after a placement decision
claimed a slot for its trial, but before it recorded the trial's run, came back after
its lease had expired, another driver had reclaimed the claim and started its own
trial on the slot, and launched anyway: two trials on one slot. Here the same moments
are played in one process on a real SQLite file: the decision, the freeze (the
leases run out), the other driver's decision, then the launch, which the claim's
token refuses. The real-process version is ``test_frozen_driver.py``.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from searcher.driver import control
from searcher.driver.control import Control
from searcher.driver.decisions import Requeue, apply_decisions
from searcher.driver.launching import AttemptStarter
from searcher.driver.outcomes import Outcomes
from searcher.driver.placement import PendingQueue, Placed
from searcher.driver.running import RunningTrials, _Running
from searcher.driver.study_side import TellQueue
from storage import (
    FENCED_EXIT_CODE,
    Allocation,
    Experiment,
    ProcessRole,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    session_scope,
    utc_from_timestamp,
    utcnow,
)
from tests.conftest import add_experiment
from tests.searcher.driver.test_driver_parts import _config, _ctx
from trials.coordination import allocations, cluster_queue
from trials.coordination.allocations import ClaimedPlacement, ClaimLostError
from trials.coordination.attempts import end_run, open_runs, trial_processes_gone
from trials.executors import JobEnding
from trials.launch.processes import ProcessRef
from trials.scheduler import Agent, AgentSlots, Placement, ResourcePool

A0 = Agent("a0", "127.0.0.1", (0,))
ONE_SLOT = ResourcePool("default", (A0,))


class _RecordingExecutor:
    """Stands in for every executor: notes what it was asked to start, starts nothing."""

    name = "local"
    remote = False
    places_trials = False
    shares_slots = False

    def __init__(self) -> None:
        self.launched: list[Any] = []

    def launch(self, request: Any) -> Any:
        self.launched.append(request)
        raise AssertionError("a launch whose claim was lost reached the executor")

    def unavailable_agents(self, names: Any) -> frozenset[str]:
        return frozenset()


class _Job:
    """A started attempt that records being ended."""

    def __init__(self) -> None:
        self.ended = False

    def poll(self) -> int | None:
        return 0 if self.ended else None

    def end(self, *, grace_s: float) -> bool:
        self.ended = True
        return True


class _ExitedJob:
    """An attempt whose processes exited with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int:
        return self.code

    def ending(self) -> JobEnding:
        return JobEnding()

    def end(self, *, grace_s: float) -> bool:
        return True


def _search(db_url: str, name: str) -> tuple[int, int]:
    """An experiment whose driver is alive, with one QUEUED 1-slot trial; (experiment, trial)."""
    experiment_id, (trial_id,) = add_experiment(
        db_url, [{"state": TrialState.QUEUED, "hparams": {"global_batch_size": 64}}], name=name
    )
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment_id)
        assert row is not None
        row.driver_heartbeat_at = utcnow()
    return experiment_id, trial_id


def _expire_leases(db_url: str, experiment_id: int) -> None:
    with session_scope(db_url) as session:
        session.execute(
            update(Allocation)
            .where(Allocation.experiment_id == experiment_id)
            .values(lease_expires_at=utcnow() - _dt.timedelta(seconds=1))
        )


def _holders(db_url: str) -> dict[tuple[str, int], int]:
    with session_scope(db_url) as session:
        return {(a.agent, a.slot): a.trial_id for a in session.scalars(select(Allocation))}


def test_a_launch_after_the_claim_was_reclaimed_and_taken_over_starts_nothing(
    db_url: str,
) -> None:
    frozen, x = _search(db_url, "frozen")
    other, y = _search(db_url, "other")
    executor = _RecordingExecutor()
    ctx = replace(_ctx(experiment_id=frozen), db_url=db_url, pool=ONE_SLOT, executor=executor)
    pending = PendingQueue(ctx)
    control = Control()
    running = RunningTrials(ctx, Outcomes(ctx, TellQueue(), control))
    with session_scope(db_url) as session:
        trial = session.get(Trial, x)
        assert trial is not None
        pending.queue(trial)
    # The decision claims a0 slot 0 for X.
    placed = pending.place()
    assert [each.trial_id for each in placed] == [x] and _holders(db_url) == {("a0", 0): x}
    # The driver is stopped before it launches X, past its lease; the other search's
    # driver queues Y and decides.
    _expire_leases(db_url, frozen)
    entry = cluster_queue.QueueEntry(trial_id=y, experiment_id=other, pool=ONE_SLOT.name, slots=1)
    with session_scope(db_url) as session:
        cluster_queue.enqueue(session, [entry])
        taken_over = cluster_queue.decide(
            session,
            ONE_SLOT,
            experiment_id=other,
            lease_s=30,
            processes_gone=lambda trial_id: trial_processes_gone(session, trial_id),
        )
    # Continued: the driver goes on with the launches it was about to make.
    apply_decisions(running.launch(placed), pending, control)

    assert [trial_id for trial_id, _ in taken_over] == [y]
    assert _holders(db_url) == {("a0", 0): y}
    # Nothing of X started or was recorded; it waits for a new placement.
    assert executor.launched == []
    assert len(running) == 0 and len(pending) == 1
    with session_scope(db_url) as session:
        assert session.scalars(select(TrialRun).where(TrialRun.trial_id == x)).all() == []
        trial = session.get(Trial, x)
        assert trial is not None and trial.state == TrialState.QUEUED


def test_the_token_tells_a_claim_from_a_later_claim_of_the_same_trial(db_url: str) -> None:
    experiment_id, trial_id = _search(db_url, "e")
    where = Placement(trial_id, ONE_SLOT.name, (AgentSlots(A0, (0,)),))
    with session_scope(db_url) as session:
        first = allocations.claim(
            session, where, trial_id=trial_id, experiment_id=experiment_id, lease_s=30
        )
        allocations.release(session, trial_id)
        second = allocations.claim(
            session, where, trial_id=trial_id, experiment_id=experiment_id, lease_s=-1
        )
    assert first and second and first != second
    old = ClaimedPlacement(trial_id, ONE_SLOT.name, where.agents, token=first)
    new = ClaimedPlacement(trial_id, ONE_SLOT.name, where.agents, token=second)
    lost = pytest.raises(ClaimLostError, match=f"claim for trial {trial_id} on a0 slots 0")
    with lost, session_scope(db_url) as session:
        allocations.confirm_claim(session, trial_id, old, lease_s=30)
    with session_scope(db_url) as session:
        allocations.confirm_claim(session, trial_id, new, lease_s=30)
        # Confirming renews the lease: a concurrent reclaim re-checks it and keeps the rows.
        (lease,) = session.scalars(select(Allocation.lease_expires_at))
    assert lease > utcnow()


def test_a_recorded_run_its_stopped_driver_may_still_start_keeps_its_slots(
    db_url: str,
) -> None:
    # The driver recorded X's run, then was stopped before it started any process: the
    # processes may start whenever it is continued, so X's processes are not "gone".
    experiment_id, trial_id = _search(db_url, "e")
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.driver_host, experiment.driver_pid = socket.gethostname(), os.getpid()
        session.add(TrialRun(trial_id=trial_id, attempt=0, agents=[], launch_token="t-x"))
    with session_scope(db_url) as session:
        assert not trial_processes_gone(session, trial_id)
    # A driver that no longer runs starts nothing: the run's processes are gone.
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.driver_pid = None
    with session_scope(db_url) as session:
        assert trial_processes_gone(session, trial_id)


def test_a_driver_back_from_a_freeze_notices_and_ends_attempts_whose_slots_went(
    db_url: str,
) -> None:
    experiment_id, trial_id = _search(db_url, "e")
    ctx = replace(
        _ctx(experiment_id=experiment_id),
        db_url=db_url,
        pool=ONE_SLOT,
        executor=_RecordingExecutor(),
    )
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.driver_host, experiment.driver_pid = socket.gethostname(), os.getpid()
        experiment.driver_heartbeat_at = utcnow() - _dt.timedelta(seconds=ctx.timings.lease_s + 5)
    stale_s = control.heartbeat(ctx, Control())  # it was stopped past its lease
    assert stale_s is not None and stale_s > ctx.timings.lease_s
    assert control.heartbeat(ctx, Control()) is None  # fresh again
    # Its attempt's claim was reclaimed meanwhile (nothing in the ledger holds it).
    outcomes = Outcomes(ctx, TellQueue(), Control())
    running = RunningTrials(ctx, outcomes)
    job = _Job()
    running._running[trial_id] = _Running(
        trial_id=trial_id, optuna_number=0, attempt=0, slots=1, job=job, started=0.0, run_id=1
    )
    running.revalidate()
    assert job.ended


def test_a_driver_whose_experiment_another_driver_took_over_stops(db_url: str) -> None:
    experiment_id, _ = _search(db_url, "e")
    ctx = replace(_ctx(experiment_id=experiment_id), db_url=db_url)
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.driver_host, experiment.driver_pid = socket.gethostname(), os.getpid() + 1
    with pytest.raises(control.DriverReplacedError, match="this driver was stopped for too long"):
        control.heartbeat(ctx, Control())


def test_a_process_row_starts_when_the_kernel_started_the_process(db_url: str) -> None:
    # Recorded long after it started (a driver back from a freeze, rank 0 after the
    # rendezvous), a process's row still says when it started.
    _, trial_id = _search(db_url, "e")
    me = ProcessRef.of(os.getpid())
    with session_scope(db_url) as session:
        run = TrialRun(trial_id=trial_id, attempt=0, agents=[])
        session.add(run)
        session.flush()
        session.add(
            TrialProcess(
                run_id=run.id,
                trial_id=trial_id,
                attempt=0,
                role=ProcessRole.RANK,
                agent="a0",
                host=me.host,
                slots=[0],
                pid=me.pid,
                create_time=me.create_time,
            )
        )
    with session_scope(db_url) as session:
        (started,) = session.scalars(select(TrialProcess.started_at))
    assert started == utc_from_timestamp(me.create_time)
    assert (utcnow() - started).total_seconds() > 0.5  # this process is older than the row


def test_a_claim_lost_after_the_run_was_recorded_starts_nothing_either(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopped after it recorded X's run, before it started X: its run was judged gone and
    # ended (a resume), its claim released and given to Y. The launch's last look before
    # starting the processes sees it; the ranks' own check would have refused them too.
    frozen, x = _search(db_url, "frozen")
    other, y = _search(db_url, "other")
    executor = _RecordingExecutor()
    config = _config(hyperparameters={"global_batch_size": 64})
    cold = config.resources.model_copy(update={"reuse_workers": False, "slots_per_trial": 1})
    ctx = replace(
        _ctx(config.model_copy(update={"resources": cold}), experiment_id=frozen),
        db_url=db_url,
        pool=ONE_SLOT,
        executor=executor,
        run_dir=tmp_path,
    )
    running = RunningTrials(ctx, Outcomes(ctx, TellQueue(), Control()))
    where = Placement(x, ONE_SLOT.name, (AgentSlots(A0, (0,)),))
    with session_scope(db_url) as session:
        token = allocations.claim(session, where, trial_id=x, experiment_id=frozen, lease_s=30)
    placement = ClaimedPlacement(x, ONE_SLOT.name, where.agents, token=token)
    confirm = AttemptStarter._confirm_before_start

    def stopped_then_confirm(self: AttemptStarter, *args: Any) -> None:
        with session_scope(db_url) as session:
            for run in open_runs(session, x):
                assert end_run(session, run, reason="driver stopped")
            allocations.release(session, x)
            allocations.claim(
                session,
                Placement(y, ONE_SLOT.name, where.agents),
                trial_id=y,
                experiment_id=other,
                lease_s=30,
            )
        confirm(self, *args)

    monkeypatch.setattr(AttemptStarter, "_confirm_before_start", stopped_then_confirm)
    # The claim was lost: nothing starts, and X waits for a new placement.
    decisions = running.launch([Placed(trial_id=x, slots=1, placement=placement)])
    assert decisions == [Requeue(trial_id=x, slots=1)]
    assert executor.launched == [] and len(running) == 0
    assert _holders(db_url) == {("a0", 0): y}
    with session_scope(db_url) as session:
        (run,) = session.scalars(select(TrialRun).where(TrialRun.trial_id == x))
        assert run.ended_at is not None and run.claim_token == token
        assert run.ranks_started_at is None
        trial = session.get(Trial, x)
        assert trial is not None and trial.state == TrialState.QUEUED


def test_an_attempt_whose_ranks_exited_fenced_is_queued_again_without_a_restart(
    db_url: str, tmp_path: Path
) -> None:
    experiment_id, trial_id = _search(db_url, "e")
    ctx = replace(
        _ctx(experiment_id=experiment_id), db_url=db_url, pool=ONE_SLOT, run_dir=tmp_path
    )
    pending = PendingQueue(ctx)
    control = Control()
    running = RunningTrials(ctx, Outcomes(ctx, TellQueue(), control))
    with session_scope(db_url) as session:
        run = TrialRun(trial_id=trial_id, attempt=0, agents=[], launch_token="t-fenced")
        session.add(run)
        session.flush()
        run_id = run.id
    job = _ExitedJob(FENCED_EXIT_CODE)
    running._running[trial_id] = _Running(
        trial_id=trial_id, optuna_number=0, attempt=0, slots=1, job=job, started=0.0, run_id=run_id
    )
    apply_decisions(running.reap(), pending, control)
    assert len(running) == 0 and len(pending) == 1
    with session_scope(db_url) as session:
        trial = session.get(Trial, trial_id)
        run = session.get(TrialRun, run_id)
        assert trial is not None and run is not None
        assert trial.state == TrialState.QUEUED and trial.restarts == 0 and trial.error is None
        assert run.exit_code == FENCED_EXIT_CODE and run.ended_at is not None
        assert run.reason is not None and "its ranks did not start" in run.reason
