"""Warm jobs and the placement decision: who gets an idle job, when it must end."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from storage import (
    Allocation,
    Experiment,
    QueuedTrial,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    contesting_trial,
    session_scope,
    utcnow,
)
from tests.trials.test_cluster_queue import A0, A1, POOL, decide, experiment, queue, running
from trials.coordination import allocations, warm_jobs
from trials.coordination.attempts import trial_processes_gone
from trials.coordination.warm_jobs import IdleJob, WaitingTrial, match_idle_jobs
from trials.scheduler import AgentSlots, Placement

# ----------------------------------------------------------------- pure matching


def test_an_idle_job_gets_the_first_waiting_trial_of_its_shape() -> None:
    match = match_idle_jobs(
        [IdleJob(1, 7, 2, None)],
        [WaitingTrial(31, 7, 2, 42), WaitingTrial(30, 7, 2, 42), WaitingTrial(29, 7, 1, 50)],
    )
    # Trial 30 arrived first; the 1-slot trial waits at a lower priority (50 > 42).
    assert match.reserved == {1: 30}
    assert match.ending == {}


@pytest.mark.parametrize(
    ("other", "why"),
    [
        (WaitingTrial(40, 8, 2, 42), "its slots are wanted by trial 40 (2 slots)"),
        (WaitingTrial(40, 7, 4, 42), "its slots are wanted by trial 40 (4 slots)"),
        (WaitingTrial(40, 8, 1, 1), "its slots are wanted by trial 40 (1 slot)"),
    ],
    ids=["another-search-same-priority", "larger-trial-same-search", "higher-priority"],
)
def test_a_job_ends_when_another_shape_waits_at_the_same_or_higher_priority(
    other: WaitingTrial, why: str
) -> None:
    # Reuse never blocks a waiting trial nor starves a larger one: the job ends and the
    # decision's own order (priority, fair share, FIFO) gives its slots away.
    match = match_idle_jobs([IdleJob(1, 7, 2, None)], [WaitingTrial(30, 7, 2, 42), other])
    assert match.reserved == {}
    assert match.ending == {1: why}


def test_a_lower_priority_trial_of_another_shape_does_not_end_the_job() -> None:
    match = match_idle_jobs(
        [IdleJob(1, 7, 2, None)],
        [WaitingTrial(30, 7, 2, 10), WaitingTrial(20, 8, 2, 42)],
    )
    assert match.reserved == {1: 30}


def test_no_decision_ends_a_job_for_want_of_a_trial() -> None:
    # A decision may run between a trial's hand-back and its driver's next ask, its own
    # driver's included (before that driver has seen the hand-back): the driver ends
    # the job once it knows no trial of its shape is coming.
    idle = [IdleJob(1, 7, 2, None)]
    assert match_idle_jobs(idle, []) == warm_jobs.WarmMatch({}, {})


def test_two_idle_jobs_of_one_shape_take_one_trial_each() -> None:
    match = match_idle_jobs(
        [IdleJob(1, 7, 1, None), IdleJob(2, 7, 1, None)],
        [WaitingTrial(30, 7, 1, 42), WaitingTrial(31, 7, 1, 42)],
    )
    assert match.reserved == {1: 30, 2: 31}
    # With one trial the job idle longest gets it and the other waits for its driver.
    match = match_idle_jobs(
        [IdleJob(1, 7, 1, None), IdleJob(2, 7, 1, None)], [WaitingTrial(30, 7, 1, 42)]
    )
    assert match == warm_jobs.WarmMatch({1: 30}, {})


# ----------------------------------------------------------------- the rule as a query


@pytest.mark.parametrize(
    ("search", "slots", "priority", "live"),
    [
        ("other", 2, 42, True),
        ("mine", 4, 42, True),
        ("other", 1, 1, True),
        ("other", 2, 50, True),
        ("other", 2, 1, False),
        (None, 0, 0, True),
    ],
    ids=[
        "another-search-same-priority",
        "larger-trial-same-search",
        "higher-priority",
        "lower-priority",
        "dead-driver",
        "nothing-else-waits",
    ],
)
def test_the_rule_as_a_query_agrees_with_the_decisions_match(
    db_url: str, search: str | None, slots: int, priority: int, live: bool
) -> None:
    # A driver deciding a running warm job's next trial ahead, and the job's rank 0
    # starting it, ask the queue what a placement decision would do once the job idles.
    mine, (next_trial,) = experiment(db_url, "mine", 1, slots=2)
    queue(db_url, mine, [next_trial], slots=2, priority=42)
    waiting = [WaitingTrial(next_trial, mine, 2, 42)]
    if search is not None:
        other, (trial,) = (
            experiment(db_url, "other", 1, slots=slots)
            if search == "other"
            else (mine, [_another_trial(db_url, mine, slots)])
        )
        queue(db_url, other, [trial], slots=slots, priority=priority)
        if live:
            waiting.append(WaitingTrial(trial, other, slots, priority))
        else:
            # A decision drops the queue of a driver that stopped heartbeating first.
            with session_scope(db_url) as session:
                row = session.get(Experiment, other)
                assert row is not None
                row.driver_heartbeat_at = utcnow() - dt.timedelta(seconds=60)
    match = match_idle_jobs([IdleJob(1, mine, 2, None)], waiting)
    with session_scope(db_url) as session:
        contested = contesting_trial(
            session, experiment_id=mine, pool=POOL.name, slots=2, priority=42, lease_s=30.0
        )
    assert (contested is None) == (match.reserved == {1: next_trial})
    assert (contested is not None) == (1 in match.ending)


def _another_trial(db_url: str, experiment_id: int, slots: int) -> int:
    """One more QUEUED trial of ``slots`` slots in the experiment; its id."""
    with session_scope(db_url) as session:
        numbers = session.scalars(
            select(Trial.optuna_trial_number).where(Trial.experiment_id == experiment_id)
        ).all()
        trial = Trial(
            experiment_id=experiment_id,
            optuna_trial_id=max(numbers) + 1,
            optuna_trial_number=max(numbers) + 1,
            state=TrialState.QUEUED,
            slots_per_trial=slots,
            hparams={},
        )
        session.add(trial)
        session.flush()
        return trial.id


# ----------------------------------------------------------------- the real decision


def _idle_job(db_url: str, experiment_id: int, trial_id: int, slots: tuple[int, ...]) -> int:
    """A warm job whose last trial ``trial_id`` ran on a0 ``slots`` and handed it back."""
    run_id = running(db_url, experiment_id, trial_id, (A0, slots))
    placement = Placement(trial_id, POOL.name, (AgentSlots(A0, slots),))
    with session_scope(db_url) as session:
        run = session.get(TrialRun, run_id)
        assert run is not None
        run.launch_token = f"token-{trial_id}"
        job_id = warm_jobs.open_job(session, run, placement, experiment_id=experiment_id)
        job = session.get(WarmJob, job_id)
        assert job is not None
        job.current_trial_id = job.current_run_id = None
    return job_id


def _ledger(db_url: str) -> dict[tuple[str, int], tuple[int, int | None]]:
    with session_scope(db_url) as session:
        return {
            (row.agent, row.slot): (row.trial_id, row.warm_job_id)
            for row in session.scalars(select(Allocation))
        }


def test_a_decision_hands_an_idle_job_the_next_trial_of_its_shape(db_url: str) -> None:
    search, trials = experiment(db_url, "warm", 3, slots=2)
    job = _idle_job(db_url, search, trials[0], (0, 1))
    queue(db_url, search, trials[1:], slots=2)
    placed = decide(db_url, search)
    # Trial 1 gets the job's slots (a1 is free too, and trial 2 starts there cold).
    assert [(trial_id, p.agents[0].agent.name) for trial_id, p in placed] == [
        (trials[1], "a0"),
        (trials[2], "a1"),
    ]
    ledger = _ledger(db_url)
    assert ledger[("a0", 0)] == ledger[("a0", 1)] == (trials[1], job)
    assert ledger[("a1", 0)] == (trials[2], None)
    with session_scope(db_url) as session:
        row = warm_jobs.reserved_job(session, trials[1])
        assert row is not None and row.id == job
        # The slots were never free in between: the job's processes hold them.
        assert session.scalars(select(QueuedTrial)).all() == []


def test_an_idle_job_ends_for_another_search_waiting_at_equal_priority(db_url: str) -> None:
    mine, (last, waiting) = experiment(db_url, "warm", 2, slots=2)
    busy, (theirs,) = experiment(db_url, "busy", 1, slots=2)
    other, (wanting,) = experiment(db_url, "other", 1, slots=2)
    job = _idle_job(db_url, mine, last, (0, 1))
    running(db_url, busy, theirs, (A1, (0, 1)))  # a1 is full
    queue(db_url, mine, [waiting], slots=2)
    queue(db_url, other, [wanting], slots=2)
    # The other search's driver decides: nothing is free, and the idle job would keep
    # its slots for its own search while the other's equal-priority trial waits.
    assert decide(db_url, other) == []
    with session_scope(db_url) as session:
        row = session.get(WarmJob, job)
        assert row is not None and row.reserved_trial_id is None
        assert row.end_reason == f"its slots are wanted by trial {other}.0 (2 slots)"
        queued = session.get(QueuedTrial, waiting)
        assert queued is not None
        assert queued.reason == "a warm job's slots are being freed for it"
    # Its slots stay held until its processes are gone.
    assert _ledger(db_url)[("a0", 0)] == (last, job)
    with session_scope(db_url) as session:
        warm_jobs.close_job(session, job, None)
    assert ("a0", 0) not in _ledger(db_url)
    # With the job gone, the decision's order places the other search's trial first.
    placed = decide(db_url, other)
    assert [trial_id for trial_id, _ in placed] == [wanting]


def test_release_keeps_a_warm_jobs_slots_and_close_frees_them(db_url: str) -> None:
    search, trials = experiment(db_url, "warm", 1, slots=2)
    job = _idle_job(db_url, search, trials[0], (0, 1))
    with session_scope(db_url) as session:
        allocations.release(session, trials[0])
    assert _ledger(db_url)[("a0", 0)] == (trials[0], job)
    with session_scope(db_url) as session:
        warm_jobs.close_job(session, job, "no trial of its shape waits")
        row = session.get(WarmJob, job)
        assert row is not None and row.ended_at is not None
        assert row.end_reason == "no trial of its shape waits"
    assert _ledger(db_url) == {}


def test_a_reserved_trials_processes_are_the_jobs(db_url: str) -> None:
    # A dead driver's lease runs out: the reserved trial ran nothing yet, but the warm
    # job's processes (this test process, recorded under its last run) still hold the
    # slots, so the ledger must not call them gone.
    import os

    from storage import ProcessRole, TrialProcess
    from trials.launch.processes import ProcessRef

    search, trials = experiment(db_url, "warm", 2, slots=2)
    job = _idle_job(db_url, search, trials[0], (0, 1))
    me = ProcessRef.of(os.getpid())
    with session_scope(db_url) as session:
        run = session.scalars(select(TrialRun).where(TrialRun.trial_id == trials[0])).one()
        session.add(
            TrialProcess(
                run_id=run.id,
                trial_id=trials[0],
                attempt=0,
                role=ProcessRole.RANK,
                rank=0,
                agent="a0",
                host=me.host,
                slots=[0],
                pid=me.pid,
                create_time=me.create_time,
            )
        )
        run.ended_at = run.started_at
        warm_jobs.reserve(session, job, trials[1], run.started_at)
    with session_scope(db_url) as session:
        assert not trial_processes_gone(session, trials[1])


def test_closing_a_reserved_job_puts_its_trial_back_in_the_queue(db_url: str) -> None:
    # The job's ranks exited between the decision and the hand-over: the trial must
    # not start on slots the ledger no longer holds for it.
    search, (last, waiting) = experiment(db_url, "warm", 2, slots=2)
    job = _idle_job(db_url, search, last, (0, 1))
    queue(db_url, search, [waiting], slots=2)
    with session_scope(db_url) as session:
        warm_jobs.reserve(session, job, waiting, session.get(TrialRun, 1).started_at)  # type: ignore[union-attr]
    with session_scope(db_url) as session:
        warm_jobs.close_job(session, job, "its ranks exited")
    with session_scope(db_url) as session:
        row = session.get(QueuedTrial, waiting)
        assert row is not None and row.placement is None
    assert _ledger(db_url) == {}
    # The next decision places it like any waiting trial.
    assert [trial_id for trial_id, _ in decide(db_url, search)] == [waiting]


def test_a_reservation_is_a_fenced_claim_like_a_decision_s(db_url: str) -> None:
    # The reserved trial's driver gets the reservation's token; once the job is closed
    # (its ranks exited between the decision and the hand-over) the launch is refused.
    search, (last, waiting) = experiment(db_url, "warm", 2, slots=2)
    job = _idle_job(db_url, search, last, (0, 1))
    queue(db_url, search, [waiting], slots=2)
    ((trial_id, placement),) = decide(db_url, search)
    assert trial_id == waiting and placement.token
    with session_scope(db_url) as session:
        tokens = set(session.scalars(select(Allocation.claim_token)))
        assert tokens == {placement.token}
        allocations.confirm_claim(session, waiting, placement, lease_s=30)
    with session_scope(db_url) as session:
        warm_jobs.close_job(session, job, "its ranks exited")
    with pytest.raises(allocations.ClaimLostError), session_scope(db_url) as session:
        allocations.confirm_claim(session, waiting, placement, lease_s=30)
