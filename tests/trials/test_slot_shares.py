"""Shares of one slot in the ledger and the cluster queue, on real databases.

No slot's claims ever add up to more than one slot: claims are admitted under the
ledger's lock, whole-slot claims also collide in the database's own unique key, and
two processes racing for quarters of one slot (SQLite and PostgreSQL) never overfill it.
"""

from __future__ import annotations

import multiprocessing
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError

from storage import (
    Allocation,
    Experiment,
    QueuedTrial,
    TrialRun,
    TrialState,
    get_engine,
    session_scope,
    upgrade_schema,
    utcnow,
)
from storage._migrate import alembic_config
from tests.conftest import POSTGRESQL, add_experiment
from tests.storage.conftest import postgres_url  # noqa: F401  (a real server for the race)
from trials.coordination import allocations, cluster_queue
from trials.coordination.allocations import ClaimedPlacement
from trials.scheduler import Agent, AgentSlots, Cluster, Placement, ResourcePool

A0 = Agent("a0", "127.0.0.1", (0, 1))
A1 = Agent("a1", "127.0.0.1", (0,))
POOL = ResourcePool("default", (A0, A1))
CLUSTER = Cluster((POOL,))


def on(trial_id: int, agent: Agent, slot: int, share: float = 1.0) -> Placement:
    return Placement(trial_id, POOL.name, (AgentSlots(agent, (slot,)),), share=share)


def claim(db_url: str, experiment_id: int, placement: Placement, lease_s: float = 30) -> bool:
    trial_id = placement.request_id
    assert isinstance(trial_id, int)
    with session_scope(db_url) as session:
        token = allocations.claim(
            session, placement, trial_id=trial_id, experiment_id=experiment_id, lease_s=lease_s
        )
    return token is not None


def used_eighths(db_url: str) -> dict[tuple[str, int], int]:
    with session_scope(db_url) as session:
        rows = session.execute(
            select(Allocation.agent, Allocation.slot, func.sum(Allocation.eighths)).group_by(
                Allocation.agent, Allocation.slot
            )
        ).all()
    return {(agent, slot): int(total) for agent, slot, total in rows}


# -- the ledger ----------------------------------------------------------------------


def test_shares_fill_a_slot_up_to_one_and_no_further(db_url: str) -> None:
    experiment_id, trials = add_experiment(db_url, [{"state": TrialState.QUEUED}] * 6)
    assert claim(db_url, experiment_id, on(trials[0], A0, 0, 0.5))
    assert claim(db_url, experiment_id, on(trials[1], A0, 0, 0.25))
    assert claim(db_url, experiment_id, on(trials[2], A0, 0, 0.125))
    # Half a slot no longer fits; an eighth does, and then nothing.
    assert not claim(db_url, experiment_id, on(trials[3], A0, 0, 0.5))
    assert claim(db_url, experiment_id, on(trials[4], A0, 0, 0.125))
    assert not claim(db_url, experiment_id, on(trials[5], A0, 0, 0.125))
    assert used_eighths(db_url) == {("a0", 0): 8}
    with session_scope(db_url) as session:
        state = allocations.ledger_state(session, POOL)
    assert state.free == {"a0": frozenset({1}), "a1": frozenset({0})}
    assert state.shared == {"a0": {0: 8}}


def test_a_share_and_a_whole_claim_never_share_a_slot(db_url: str) -> None:
    experiment_id, (whole, quarter, other) = add_experiment(
        db_url, [{"state": TrialState.QUEUED}] * 3
    )
    assert claim(db_url, experiment_id, on(whole, A0, 0))
    assert not claim(db_url, experiment_id, on(quarter, A0, 0, 0.25))
    assert claim(db_url, experiment_id, on(quarter, A0, 1, 0.25))
    # Three quarters are left on a0/1, but not for a whole claim.
    assert not claim(db_url, experiment_id, on(other, A0, 1))
    assert used_eighths(db_url) == {("a0", 0): 8, ("a0", 1): 2}


def test_whole_claims_of_one_slot_collide_in_the_database_itself(db_url: str) -> None:
    """The partial unique key: even a writer that skips the ledger cannot double a slot."""
    experiment_id, (first, second) = add_experiment(db_url, [{"state": TrialState.QUEUED}] * 2)
    assert claim(db_url, experiment_id, on(first, A0, 0))
    now = utcnow()
    with pytest.raises(IntegrityError), session_scope(db_url) as session:
        session.add(
            Allocation(
                resource_pool=POOL.name,
                agent="a0",
                host="127.0.0.1",
                slot=0,
                trial_id=second,
                experiment_id=experiment_id,
                lease_expires_at=now,
            )
        )


def test_releasing_the_last_share_frees_the_slot(db_url: str) -> None:
    experiment_id, (a, b, whole) = add_experiment(db_url, [{"state": TrialState.QUEUED}] * 3)
    assert claim(db_url, experiment_id, on(a, A1, 0, 0.5))
    assert claim(db_url, experiment_id, on(b, A1, 0, 0.5))
    with session_scope(db_url) as session:
        allocations.release(session, a)
    assert not claim(db_url, experiment_id, on(whole, A1, 0))
    with session_scope(db_url) as session:
        assert allocations.ledger_state(session, POOL).shared == {"a1": {0: 4}}
        allocations.release(session, b)
    assert claim(db_url, experiment_id, on(whole, A1, 0))


def test_an_expired_share_is_reclaimed_alone_once_its_processes_are_gone(db_url: str) -> None:
    experiment_id, (dead, alive) = add_experiment(db_url, [{"state": TrialState.QUEUED}] * 2)
    assert claim(db_url, experiment_id, on(dead, A1, 0, 0.5), lease_s=-1)
    assert claim(db_url, experiment_id, on(alive, A1, 0, 0.5))
    with session_scope(db_url) as session:
        assert allocations.reclaim_stale(session, utcnow(), processes_gone=lambda t: False) == []
    assert used_eighths(db_url) == {("a1", 0): 8}
    with session_scope(db_url) as session:
        assert allocations.reclaim_stale(session, utcnow(), processes_gone=lambda t: True) == [
            dead
        ]
    assert used_eighths(db_url) == {("a1", 0): 4}


def test_a_share_claim_is_fenced_like_a_whole_one(db_url: str) -> None:
    experiment_id, (trial,) = add_experiment(db_url, [{"state": TrialState.QUEUED}])
    with session_scope(db_url) as session:
        token = allocations.claim(
            session,
            on(trial, A0, 1, 0.25),
            trial_id=trial,
            experiment_id=experiment_id,
            lease_s=30,
        )
    placed = ClaimedPlacement(trial, POOL.name, (AgentSlots(A0, (1,)),), share=0.25, token=token)
    with session_scope(db_url) as session:
        allocations.confirm_claim(session, trial, placed, 30)
        allocations.release(session, trial)
    with pytest.raises(allocations.ClaimLostError), session_scope(db_url) as session:
        allocations.confirm_claim(session, trial, placed, 30)


def test_holders_show_which_trials_share_a_slot_and_what_is_free(db_url: str) -> None:
    experiment_id, (half, quarter, whole) = add_experiment(
        db_url, [{"state": TrialState.RUNNING}] * 3, name="shares"
    )
    assert claim(db_url, experiment_id, on(quarter, A0, 1, 0.25))
    assert claim(db_url, experiment_id, on(half, A0, 1, 0.5))
    assert claim(db_url, experiment_id, on(whole, A1, 0))
    with session_scope(db_url) as session:
        rows = allocations.holders(session, CLUSTER)
    assert [(r.agent, r.slot, r.trial_number, r.eighths) for r in rows] == [
        ("a0", 0, None, 8),  # free
        ("a0", 1, 0, 4),  # the half, then the quarter, then what is left
        ("a0", 1, 1, 2),
        ("a0", 1, None, 2),
        ("a1", 0, 2, 8),
    ]
    assert [r.held for r in rows] == [False, True, True, False, True]


# -- the cluster queue -----------------------------------------------------------------


def live_experiment(db_url: str, name: str, trials: int, **config: Any) -> tuple[int, list[int]]:
    experiment_id, trial_ids = add_experiment(
        db_url, [{"state": TrialState.QUEUED}] * trials, name=name
    )
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment_id)
        assert row is not None
        row.driver_heartbeat_at = utcnow()
        row.config = {"resources": config}
    return experiment_id, trial_ids


def enqueue(db_url: str, experiment_id: int, trial_ids: list[int], **fields: Any) -> None:
    fields.setdefault("slots", 1)
    with session_scope(db_url) as session:
        cluster_queue.enqueue(
            session,
            [
                cluster_queue.QueueEntry(
                    trial_id=trial_id, experiment_id=experiment_id, pool=POOL.name, **fields
                )
                for trial_id in trial_ids
            ],
        )


def decide(db_url: str, experiment_id: int, pool: ResourcePool = POOL) -> list[Any]:
    with session_scope(db_url) as session:
        return cluster_queue.decide(
            session, pool, experiment_id=experiment_id, lease_s=30, processes_gone=lambda t: False
        )


def reasons(db_url: str) -> dict[str, str | None]:
    with session_scope(db_url) as session:
        return {view.label: view.reason for view in cluster_queue.queue_view(session)}


def test_a_decision_packs_quarters_onto_one_slot_and_hands_them_out_fenced(db_url: str) -> None:
    experiment_id, trials = live_experiment(db_url, "quarters", 5)
    enqueue(db_url, experiment_id, trials, eighths=2)
    placed = decide(db_url, experiment_id)
    # Four quarters fill one slot (a1's, best fit: the agent with the fewest free
    # slots), the fifth shares a0's slot 0 alone.
    where = {
        trial_id: (p.agents[0].agent.name, p.agents[0].slots, p.share) for trial_id, p in placed
    }
    assert where == {
        **{t: ("a1", (0,), 0.25) for t in trials[:4]},
        trials[4]: ("a0", (0,), 0.25),
    }
    assert all(p.token for _, p in placed)
    assert used_eighths(db_url) == {("a1", 0): 8, ("a0", 0): 2}
    with session_scope(db_url) as session:
        for trial_id, placement in placed:
            allocations.confirm_claim(session, trial_id, placement, 30)


def test_two_halves_share_the_only_slot_and_a_third_waits(db_url: str) -> None:
    one = ResourcePool("default", (Agent("a0", "127.0.0.1", (0,)),))
    experiment_id, trials = live_experiment(db_url, "halves", 3)
    enqueue(db_url, experiment_id, trials, eighths=4)
    placed = decide(db_url, experiment_id, one)
    assert [t for t, _ in placed] == trials[:2]
    assert reasons(db_url) == {
        f"{experiment_id}.2": "no slot in pool default has 1/2 of a slot free"
    }
    with session_scope(db_url) as session:
        views = cluster_queue.queue_view(session)
    assert [(v.slots, v.share) for v in views] == [(1, 0.5)]


def test_fair_share_counts_held_shares_at_their_fraction(db_url: str) -> None:
    small, small_trials = live_experiment(db_url, "small", 4)
    whole, whole_trials = live_experiment(db_url, "whole", 3)
    # "whole" holds one slot; "small" holds a half: small's half goes first, and the
    # next free slot goes to whole (holding 1) rather than to small (1 after it).
    assert claim(db_url, whole, on(whole_trials[0], A1, 0))
    assert claim(db_url, small, on(small_trials[0], A0, 0, 0.5))
    enqueue(db_url, small, small_trials[1:], eighths=4)
    enqueue(db_url, whole, whole_trials[1:])
    placed = decide(db_url, small)
    mine = [t for t, _ in placed]
    # small's next half fills a0/0; whole's trial takes a0/1; small's third waits.
    assert mine == [small_trials[1]]
    assert used_eighths(db_url) == {("a0", 0): 8, ("a1", 0): 8, ("a0", 1): 8}
    assert reasons(db_url)[f"{small}.3"] == "no slot in pool default has 1/2 of a slot free"


def test_preemption_frees_the_room_a_share_needs(db_url: str) -> None:
    one = ResourcePool("default", (Agent("a0", "127.0.0.1", (0,)),), preemption=True)
    low, low_trials = live_experiment(db_url, "low", 2, priority=50)
    high, (urgent,) = live_experiment(db_url, "high", 1, priority=1)
    for trial_id in low_trials:
        assert claim(db_url, low, on(trial_id, A0, 0, 0.5))
        with session_scope(db_url) as session:
            session.add(TrialRun(trial_id=trial_id, attempt=0, agents=[]))
    _checkpointed(db_url, low_trials)
    enqueue(db_url, high, [urgent], eighths=4, priority=1)
    assert decide(db_url, high, one) == []
    with session_scope(db_url) as session:
        asked = [r.trial_id for r in session.scalars(select(TrialRun)) if r.stop_requested_at]
    # One half is enough, and the latest started goes.
    assert asked == [low_trials[1]]


def _checkpointed(db_url: str, trial_ids: list[int]) -> None:
    from storage import Checkpoint, CheckpointState

    with session_scope(db_url) as session:
        for trial_id in trial_ids:
            session.add(
                Checkpoint(
                    trial_id=trial_id,
                    uuid=f"c{trial_id}",
                    step=1,
                    path=f"/tmp/c{trial_id}",
                    state=CheckpointState.COMPLETED,
                )
            )


# -- the schema ----------------------------------------------------------------------


def test_a_ledger_from_before_revision_0015_holds_whole_slots(tmp_path: Path) -> None:
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0014")
    experiment_id, (trial,) = add_experiment(url, [{"state": TrialState.RUNNING}])
    with get_engine(url).begin() as connection:
        connection.execute(
            text(
                "INSERT INTO slotsweep_allocations (resource_pool, agent, host, slot, trial_id, "
                "experiment_id, allocated_at, lease_expires_at) VALUES ('default', 'a0', "
                f"'127.0.0.1', 0, {trial}, {experiment_id}, '2026-11-01', '2099-01-01')"
            )
        )
    upgrade_schema(url)
    with session_scope(url) as session:
        assert session.scalars(select(Allocation.eighths)).all() == [8]
        assert allocations.ledger_state(session, POOL).free["a0"] == frozenset({1})
        assert session.scalars(select(QueuedTrial.eighths)).all() == []
    assert not claim(url, experiment_id, on(trial + 1000, A0, 0, 0.125))


# -- racing processes ----------------------------------------------------------------

ROUNDS = 15
RACERS = 3


def _racer(db_url: str, trial_ids: list[int], experiment_id: int, barrier: Any) -> None:
    """Claim a quarter of a1's only slot for each of ``trial_ids``, all at once with the
    other racers, then let go; round after round."""
    for _ in range(ROUNDS):
        barrier.wait()
        for trial_id in trial_ids:
            with session_scope(db_url) as session:
                allocations.claim(
                    session,
                    on(trial_id, A1, 0, 0.25),
                    trial_id=trial_id,
                    experiment_id=experiment_id,
                    lease_s=60,
                )
        barrier.wait()  # every racer has tried: the slot holds what it holds
        barrier.wait()  # the parent has looked
        for trial_id in trial_ids:
            with session_scope(db_url) as session:
                allocations.release(session, trial_id)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", POSTGRESQL])
def test_racing_processes_never_claim_a_slot_past_its_capacity(
    backend: str, db_url: str, request: pytest.FixtureRequest
) -> None:
    if backend == "postgresql":
        db_url = request.getfixturevalue("postgres_url")
        upgrade_schema(db_url)
    experiment_id, trial_ids = add_experiment(
        db_url, [{"state": TrialState.QUEUED}] * (RACERS * 2)
    )
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(RACERS + 1, timeout=120)
    procs = [
        context.Process(
            target=_racer, args=(db_url, trial_ids[i * 2 : i * 2 + 2], experiment_id, barrier)
        )
        for i in range(RACERS)
    ]
    for proc in procs:
        proc.start()
    totals = []
    for _ in range(ROUNDS):
        barrier.wait()
        barrier.wait()
        used = used_eighths(db_url)
        totals.append(used.get(("a1", 0), 0))
        barrier.wait()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    # Six quarters wanted one slot each round: exactly four got it, never five.
    assert totals == [8] * ROUNDS
    by_slot: dict[int, int] = defaultdict(int)
    with session_scope(db_url) as session:
        for slot, eighths in session.execute(select(Allocation.slot, Allocation.eighths)):
            by_slot[slot] += eighths
    assert dict(by_slot) == {}
