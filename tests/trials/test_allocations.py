"""Slot ownership in a real SQLite database: claims, leases, reclaim and racing drivers."""

from __future__ import annotations

import datetime as _dt
import multiprocessing
from typing import Any

import pytest
from sqlalchemy import func, select, update

from storage import (
    Allocation,
    TrialState,
    WarmJob,
    session_scope,
    upgrade_schema,
    utcnow,
)
from tests.conftest import POSTGRESQL, add_experiment
from tests.storage.conftest import postgres_url  # noqa: F401  (a real server for the race)
from trials.coordination import allocations
from trials.scheduler import Agent, AgentSlots, Cluster, Placement, ResourcePool

A0 = Agent("a0", "127.0.0.1", (0, 1))
A1 = Agent("a1", "127.0.0.1", (0, 1))
POOL = ResourcePool("default", (A0, A1))
CLUSTER = Cluster((POOL,))


def placement(request_id: int, *parts: tuple[Agent, tuple[int, ...]]) -> Placement:
    return Placement(
        request_id, POOL.name, tuple(AgentSlots(agent, slots) for agent, slots in parts)
    )


def make_trials(db_url: str, count: int, name: str = "exp") -> tuple[int, list[int]]:
    """An experiment with ``count`` queued trials; its id and theirs."""
    return add_experiment(db_url, [{"state": TrialState.QUEUED}] * count, name=name)


def allocation_count(db_url: str) -> int:
    with session_scope(db_url) as session:
        return int(session.scalar(select(func.count()).select_from(Allocation)) or 0)


def test_claimed_slots_are_no_longer_free(db_url: str) -> None:
    experiment_id, (t1, _) = make_trials(db_url, 2)
    with session_scope(db_url) as session:
        assert allocations.free_slots(session, POOL) == {
            "a0": frozenset({0, 1}),
            "a1": frozenset({0, 1}),
        }
        assert allocations.claim(
            session,
            placement(t1, (A0, (1,)), (A1, (0, 1))),
            trial_id=t1,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        assert allocations.free_slots(session, POOL) == {
            "a0": frozenset({0}),
            "a1": frozenset(),
        }


def test_a_claim_is_all_or_nothing(db_url: str) -> None:
    experiment_id, (t1, t2) = make_trials(db_url, 2)
    with session_scope(db_url) as session:
        assert allocations.claim(
            session,
            placement(t1, (A0, (0,))),
            trial_id=t1,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        # a1's slots are free, but a0 slot 0 is not: nothing of this claim may be written.
        assert not allocations.claim(
            session,
            placement(t2, (A1, (0, 1)), (A0, (0, 1))),
            trial_id=t2,
            experiment_id=experiment_id,
            lease_s=30,
        )
    assert allocation_count(db_url) == 1
    with session_scope(db_url) as session:
        assert allocations.claim(
            session,
            placement(t2, (A1, (0, 1)), (A0, (1,))),
            trial_id=t2,
            experiment_id=experiment_id,
            lease_s=30,
        )
    assert allocation_count(db_url) == 4


def test_release_frees_a_trials_slots(db_url: str) -> None:
    experiment_id, (t1, t2) = make_trials(db_url, 2)
    with session_scope(db_url) as session:
        allocations.claim(
            session,
            placement(t1, (A0, (0, 1))),
            trial_id=t1,
            experiment_id=experiment_id,
            lease_s=30,
        )
        allocations.claim(
            session,
            placement(t2, (A1, (0,))),
            trial_id=t2,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        allocations.release(session, t1)
    with session_scope(db_url) as session:
        assert allocations.free_slots(session, POOL)["a0"] == frozenset({0, 1})
        assert [h.trial_id for h in allocations.holders(session)] == [t2]


def test_an_expired_lease_frees_its_slots_only_once_its_processes_are_gone(
    db_url: str,
) -> None:
    experiment_id, (dead, alive, newcomer) = make_trials(db_url, 3)
    with session_scope(db_url) as session:
        # The "dead" driver stopped renewing: its lease has run out.
        allocations.claim(
            session,
            placement(dead, (A0, (0, 1))),
            trial_id=dead,
            experiment_id=experiment_id,
            lease_s=-1,
        )
        allocations.claim(
            session,
            placement(alive, (A1, (0,))),
            trial_id=alive,
            experiment_id=experiment_id,
            lease_s=300,
        )
    now = utcnow()
    asked: list[int] = []

    def still_training(trial_id: int) -> bool:
        asked.append(trial_id)
        return False

    with session_scope(db_url) as session:
        stale = {h.trial_id for h in allocations.holders(session, now=now) if h.stale}
        assert stale == {dead}
        # Its trial may still train on those slots: they stay held.
        assert allocations.reclaim_stale(session, now, processes_gone=still_training) == []
        assert asked == [dead]
        assert allocations.free_slots(session, POOL) == {"a0": frozenset(), "a1": frozenset({1})}
        assert not allocations.claim(
            session,
            placement(newcomer, (A0, (0, 1))),
            trial_id=newcomer,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        gone = allocations.reclaim_stale(session, now, processes_gone=lambda trial_id: True)
        assert gone == [dead]
    with session_scope(db_url) as session:
        assert {h.trial_id for h in allocations.holders(session)} == {alive}
        assert allocations.free_slots(session, POOL) == {
            "a0": frozenset({0, 1}),
            "a1": frozenset({1}),
        }
        assert allocations.claim(
            session,
            placement(newcomer, (A0, (0, 1))),
            trial_id=newcomer,
            experiment_id=experiment_id,
            lease_s=30,
        )


def test_a_claim_never_takes_over_a_held_row_even_when_its_lease_expired(db_url: str) -> None:
    experiment_id, (dead, newcomer) = make_trials(db_url, 2)
    with session_scope(db_url) as session:
        allocations.claim(
            session,
            placement(dead, (A0, (0,))),
            trial_id=dead,
            experiment_id=experiment_id,
            lease_s=-1,
        )
    with session_scope(db_url) as session:
        assert not allocations.claim(
            session,
            placement(newcomer, (A0, (0, 1))),
            trial_id=newcomer,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        assert {h.trial_id for h in allocations.holders(session)} == {dead}


def test_renewing_keeps_a_lease_alive(db_url: str) -> None:
    experiment_id, (t1,) = make_trials(db_url, 1)
    other_experiment, (t2,) = make_trials(db_url, 1, name="other")
    with session_scope(db_url) as session:
        allocations.claim(
            session, placement(t1, (A0, (0,))), trial_id=t1, experiment_id=experiment_id, lease_s=1
        )
        allocations.claim(
            session,
            placement(t2, (A1, (0,))),
            trial_id=t2,
            experiment_id=other_experiment,
            lease_s=1,
        )
    later = utcnow() + _dt.timedelta(seconds=60)
    with session_scope(db_url) as session:
        allocations.renew_leases(session, experiment_id, lease_s=600)
    with session_scope(db_url) as session:
        # Only the renewed experiment's lease is still live a minute from now.
        stale = {h.trial_id for h in allocations.holders(session, now=later) if h.stale}
        assert stale == {t2}
        assert allocations.reclaim_stale(session, later, lambda trial_id: True) == [t2]
        assert allocations.free_slots(session, POOL) == {
            "a0": frozenset({1}),
            "a1": frozenset({0, 1}),
        }


def test_holders_list_every_slot_of_the_cluster(db_url: str) -> None:
    experiment_id, (t1,) = make_trials(db_url, 1, name="digits")
    with session_scope(db_url) as session:
        allocations.claim(
            session,
            placement(t1, (A1, (1,))),
            trial_id=t1,
            experiment_id=experiment_id,
            lease_s=30,
        )
        # A slot of an agent this cluster does not declare (another driver's cluster file).
        foreign = Agent("elsewhere", "10.0.0.9", (3,))
        allocations.claim(
            session,
            Placement(t1, "default", (AgentSlots(foreign, (3,)),)),
            trial_id=t1,
            experiment_id=experiment_id,
            lease_s=30,
        )
    with session_scope(db_url) as session:
        rows = allocations.holders(session, CLUSTER)
    assert [(r.pool, r.agent, r.slot, r.trial_id) for r in rows] == [
        ("default", "a0", 0, None),
        ("default", "a0", 1, None),
        ("default", "a1", 0, None),
        ("default", "a1", 1, t1),
        ("default", "elsewhere", 3, t1),
    ]
    held = rows[3]
    assert (held.experiment_id, held.experiment_name, held.trial_number, held.stale) == (
        experiment_id,
        "digits",
        0,
        False,
    )
    assert held.host == "127.0.0.1" and rows[4].host == "10.0.0.9"


def _warm_job(db_url: str, experiment_id: int, trial_id: int, agent: Agent, **fields: Any) -> int:
    """Trial ``trial_id``'s claimed slots on ``agent`` made a warm job's, as
    ``trials.coordination.warm_jobs.open_job`` makes them; the job's id."""
    with session_scope(db_url) as session:
        job = WarmJob(
            experiment_id=experiment_id,
            resource_pool=POOL.name,
            slots=len(agent.slots),
            placement=[{"agent": agent.name, "host": agent.host, "slots": list(agent.slots)}],
            launch_token=f"token-{trial_id}",
            **{"trials_run": 0, **fields},
        )
        session.add(job)
        session.flush()
        session.execute(
            update(Allocation).where(Allocation.trial_id == trial_id).values(warm_job_id=job.id)
        )
        return job.id


def test_a_warm_job_s_slots_name_the_job_and_what_it_runs(db_url: str) -> None:
    experiment_id, (done, running, waiting) = add_experiment(
        db_url,
        [{"state": TrialState.COMPLETED}, {}, {"state": TrialState.QUEUED}],
        name="warm",
    )
    with session_scope(db_url) as session:
        for trial_id, agent in ((running, A0), (done, A1)):
            assert allocations.claim(
                session,
                placement(trial_id, (agent, agent.slots)),
                trial_id=trial_id,
                experiment_id=experiment_id,
                lease_s=30,
            )
    busy = _warm_job(db_url, experiment_id, running, A0, current_trial_id=running)
    # The job on a1 ran `done` and is idle: its rows keep `done`, which is over.
    idle = _warm_job(db_url, experiment_id, done, A1, idle_since=utcnow(), trials_run=1)
    with session_scope(db_url) as session:
        allocations.release(session, done)  # the driver records the trial's end
        rows = allocations.holders(session, CLUSTER)

    def seen(rows: list[allocations.SlotHolder]) -> list[tuple[Any, ...]]:
        return [(r.agent, r.trial_id, r.trial_number, r.warm_job_id, r.warm_state) for r in rows]

    assert seen(rows) == [
        ("a0", running, 1, busy, "running"),
        ("a0", running, 1, busy, "running"),
        ("a1", None, None, idle, "idle"),
        ("a1", None, None, idle, "idle"),
    ]
    # Held all the same, by the job's experiment, under the lease its driver renews.
    assert all(r.held and r.experiment_id == experiment_id and not r.stale for r in rows)
    assert rows[2].experiment_name == "warm"
    assert not allocations.SlotHolder("default", "a0", "127.0.0.1", 0).held

    # A decision reserves the idle job for a waiting trial: the rows move to it.
    with session_scope(db_url) as session:
        session.execute(
            update(Allocation).where(Allocation.warm_job_id == idle).values(trial_id=waiting)
        )
        session.execute(
            update(WarmJob).where(WarmJob.id == idle).values(reserved_trial_id=waiting)
        )
        rows = allocations.holders(session, CLUSTER)
    assert seen(rows)[2:] == [("a1", waiting, 2, idle, "reserved")] * 2

    # Asked to end: the reservation is void, while the running trial runs on to its end.
    with session_scope(db_url) as session:
        session.execute(update(WarmJob).values(end_requested_at=utcnow()))
        rows = allocations.holders(session, CLUSTER)
    assert [(r.trial_id, r.warm_state) for r in rows] == [
        (running, "running"),
        (running, "running"),
        (None, "ending"),
        (None, "ending"),
    ]


# -- two processes racing for the same slots ------------------------------------------

ROUNDS = 30
# The two claimants overlap on a0 slot 1 only: all-or-nothing means the loser's a1 slot
# must not be written either.
CLAIMS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    "first": (("a0", (0, 1)),),
    "second": (("a1", (0,)), ("a0", (1,))),
}


def _racer(
    name: str, db_url: str, trial_id: int, experiment_id: int, barrier: Any, results: Any
) -> None:
    agents = {agent.name: agent for agent in POOL.agents}
    mine = Placement(
        trial_id, POOL.name, tuple(AgentSlots(agents[a], slots) for a, slots in CLAIMS[name])
    )
    for round_ in range(ROUNDS):
        barrier.wait()
        with session_scope(db_url) as session:
            won = allocations.claim(
                session, mine, trial_id=trial_id, experiment_id=experiment_id, lease_s=60
            )
        barrier.wait()  # both have tried
        if won:
            with session_scope(db_url) as session:
                rows = session.execute(
                    select(Allocation.trial_id, Allocation.agent, Allocation.slot).where(
                        Allocation.experiment_id == experiment_id
                    )
                ).all()
                results.put((round_, name, sorted(tuple(r) for r in rows)))
                allocations.release(session, trial_id)
        barrier.wait()  # the winner has released: next round starts from a free pool


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", POSTGRESQL])
def test_two_processes_racing_for_slots_never_both_win(
    backend: str, db_url: str, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        db_url = request.getfixturevalue("postgres_url")
        upgrade_schema(db_url)
    experiment_id, (t_first, t_second) = make_trials(db_url, 2)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2, timeout=120)
    results = context.Queue()
    procs = [
        context.Process(
            target=_racer, args=(name, db_url, trial_id, experiment_id, barrier, results)
        )
        for name, trial_id in (("first", t_first), ("second", t_second))
    ]
    for proc in procs:
        proc.start()
    wins = [results.get(timeout=120) for _ in range(ROUNDS)]
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    assert results.empty()
    # Exactly one winner every round, and only the winner's slots were ever written.
    assert sorted(round_ for round_, _, _ in wins) == list(range(ROUNDS))
    ids = {"first": t_first, "second": t_second}
    for _, name, rows in wins:
        expected = sorted(
            (ids[name], agent, slot) for agent, slots in CLAIMS[name] for slot in slots
        )
        assert rows == expected
    with session_scope(db_url) as session:
        assert [h for h in allocations.holders(session) if h.experiment_id == experiment_id] == []
