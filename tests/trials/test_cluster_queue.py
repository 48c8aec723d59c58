"""The cluster-wide queue on a real database: one decision over every experiment's trials."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any

import pytest
from sqlalchemy import delete, select

from storage import (
    Allocation,
    Checkpoint,
    CheckpointState,
    Experiment,
    QueuedTrial,
    TrialRun,
    TrialState,
    session_scope,
    utcnow,
)
from tests.conftest import add_experiment
from tests.storage.conftest import postgres_url  # noqa: F401  (a real server)
from trials.coordination import allocations, cluster_queue
from trials.scheduler import Agent, AgentSlots, Placement, ResourcePool

A0 = Agent("a0", "127.0.0.1", (0, 1))
A1 = Agent("a1", "127.0.0.1", (0, 1))
POOL = ResourcePool("default", (A0, A1))


def experiment(
    db_url: str, name: str, trials: int, *, priority: int = 42, slots: int = 1
) -> tuple[int, list[int]]:
    """An experiment whose driver is alive, with ``trials`` queued trials of ``slots``."""
    experiment_id, trial_ids = add_experiment(
        db_url, [{"state": TrialState.QUEUED, "slots_per_trial": slots}] * trials, name=name
    )
    with session_scope(db_url) as session:
        row = session.get(Experiment, experiment_id)
        assert row is not None
        row.driver_heartbeat_at = utcnow()
        row.config = {"resources": {"priority": priority}}
    return experiment_id, trial_ids


def queue(db_url: str, experiment_id: int, trial_ids: list[int], **fields: Any) -> None:
    fields.setdefault("slots", 1)
    entries = [
        cluster_queue.QueueEntry(
            trial_id=trial_id, experiment_id=experiment_id, pool=POOL.name, **fields
        )
        for trial_id in trial_ids
    ]
    with session_scope(db_url) as session:
        cluster_queue.enqueue(session, entries)


def running(
    db_url: str, experiment_id: int, trial_id: int, *parts: tuple[Agent, tuple[int, ...]]
) -> int:
    """Mark ``trial_id`` running on ``parts`` (claimed slots, an open run); its run id."""
    placement = Placement(
        trial_id, POOL.name, tuple(AgentSlots(agent, slots) for agent, slots in parts)
    )
    with session_scope(db_url) as session:
        assert allocations.claim(
            session, placement, trial_id=trial_id, experiment_id=experiment_id, lease_s=30
        )
        run = TrialRun(trial_id=trial_id, attempt=0, agents=[])
        session.add(run)
        session.flush()
        return run.id


def decide(db_url: str, experiment_id: int) -> list[tuple[int, Placement]]:
    with session_scope(db_url) as session:
        return cluster_queue.decide(
            session,
            POOL,
            experiment_id=experiment_id,
            lease_s=30,
            processes_gone=lambda trial_id: False,
        )


def reasons(db_url: str) -> dict[str, str | None]:
    with session_scope(db_url) as session:
        return {view.label: view.reason for view in cluster_queue.queue_view(session)}


def test_a_higher_priority_trial_of_another_experiment_goes_first(db_url: str) -> None:
    # The case: a priority-1 trial of 4 slots, queued while another experiment's
    # priority-42 trials wait for the same slots, starts before all of them.
    low, low_trials = experiment(db_url, "low", 7)
    high, (big,) = experiment(db_url, "high", 1, priority=1, slots=4)
    running(db_url, low, low_trials[0], (A0, (0,)))
    queue(db_url, low, low_trials[1:])
    queue(db_url, high, [big], slots=4, priority=1)
    # The low-priority driver decides: one slot of a0 and both of a1 are free, but the
    # blocked 4-slot trial reserves both agents, so none of its trials start.
    assert decide(db_url, low) == []
    why = reasons(db_url)
    assert why[f"{high}.0"] == "pool default has fewer than 2 free agents of 2 slots"
    assert why[f"{low}.1"] == f"agents a0, a1 reserved for trial {high}.0 by backfilling"
    # The running trial ends; the next decision (by either driver) places the big one.
    with session_scope(db_url) as session:
        allocations.release(session, low_trials[0])
    assert decide(db_url, low) == []
    with session_scope(db_url) as session:
        held = session.scalars(select(Allocation.trial_id)).all()
    assert held == [big] * 4
    # Nothing is free now; the placed trial is no longer anyone's reason to wait.
    assert reasons(db_url)[f"{low}.1"] == "no agent in pool default has 1 free slot"
    # Its own driver takes it (the row leaves the queue) and starts it.
    (placed,) = decide(db_url, high)
    assert placed[0] == big and placed[1].slots == 4
    assert f"{high}.0" not in reasons(db_url)


def test_fair_share_serves_the_experiment_holding_fewer_slots(db_url: str) -> None:
    many, many_trials = experiment(db_url, "many", 50)
    few, few_trials = experiment(db_url, "few", 3)
    # "many" queued first and already holds two slots.
    running(db_url, many, many_trials[0], (A0, (0, 1)))
    queue(db_url, many, many_trials[1:])
    queue(db_url, few, few_trials)
    placed = decide(db_url, few)
    assert [trial_id for trial_id, _ in placed] == few_trials[:2]
    assert (
        reasons(db_url)[f"{many}.1"]
        == f"fair share: experiment {many} holds its share (2 of 2 slots)"
    )


def test_weights_divide_the_slots_of_one_decision(db_url: str) -> None:
    # A weight-3 experiment gets three slots for every one of a weight-1 experiment.
    heavy, heavy_trials = experiment(db_url, "heavy", 8)
    light, light_trials = experiment(db_url, "light", 8)
    queue(db_url, heavy, heavy_trials, weight=3.0)
    queue(db_url, light, light_trials, weight=1.0)
    decide(db_url, heavy)
    with session_scope(db_url) as session:
        held = [row.experiment_id for row in session.scalars(select(Allocation))]
    assert sorted(held) == sorted([heavy] * 3 + [light])


def test_placements_for_other_experiments_wait_for_their_own_driver(db_url: str) -> None:
    first, first_trials = experiment(db_url, "first", 1)
    second, second_trials = experiment(db_url, "second", 1)
    queue(db_url, first, first_trials)
    queue(db_url, second, second_trials)
    mine = decide(db_url, first)
    assert [trial_id for trial_id, _ in mine] == first_trials
    with session_scope(db_url) as session:
        row = session.get(QueuedTrial, second_trials[0])
        assert row is not None and row.placement is not None
        # The slots are claimed for the other experiment's trial, under its name.
        owners = {a.trial_id: a.experiment_id for a in session.scalars(select(Allocation))}
    assert owners == {first_trials[0]: first, second_trials[0]: second}
    (theirs,) = decide(db_url, second)
    assert theirs[0] == second_trials[0]
    with session_scope(db_url) as session:
        assert session.scalars(select(QueuedTrial)).all() == []


def test_a_dead_driver_s_trials_leave_the_queue_and_leave_gives_slots_back(db_url: str) -> None:
    dead, dead_trials = experiment(db_url, "dead", 2)
    live, live_trials = experiment(db_url, "live", 5)
    queue(db_url, dead, dead_trials)
    with session_scope(db_url) as session:
        row = session.get(Experiment, dead)
        assert row is not None
        row.driver_heartbeat_at = utcnow() - _dt.timedelta(seconds=60)
    queue(db_url, live, live_trials)
    placed = decide(db_url, live)
    # The dead experiment's trials arrived first, yet the live one's take every slot.
    assert [trial_id for trial_id, _ in placed] == live_trials[:4]
    assert set(reasons(db_url)) == {f"{live}.4"}
    # A driver that pauses takes its waiting trials out and frees what was placed.
    other, other_trials = experiment(db_url, "other", 1)
    with session_scope(db_url) as session:
        for trial_id in live_trials[:4]:
            allocations.release(session, trial_id)
    queue(db_url, other, other_trials)
    queue(db_url, live, live_trials)
    decide(db_url, live)  # places other's trial, and live's 4 queued ones again
    with session_scope(db_url) as session:
        cluster_queue.leave(session, other)
        owners = {a.experiment_id for a in session.scalars(select(Allocation))}
    assert owners == {live}


def _checkpoint(db_url: str, trial_id: int) -> None:
    with session_scope(db_url) as session:
        session.add(
            Checkpoint(
                trial_id=trial_id,
                uuid=f"ckpt-{trial_id}",
                step=10,
                path=f"/tmp/ckpt-{trial_id}",
                state=CheckpointState.COMPLETED,
            )
        )


@pytest.mark.parametrize("checkpointed", [True, False])
def test_preemption_stops_the_fewest_lower_priority_trials(
    db_url: str, checkpointed: bool
) -> None:
    pool = dataclasses.replace(POOL, preemption=True)
    low, low_trials = experiment(db_url, "low", 3)
    high, (urgent,) = experiment(db_url, "high", 1, priority=1, slots=2)
    runs = {
        low_trials[0]: running(db_url, low, low_trials[0], (A0, (0,))),
        low_trials[1]: running(db_url, low, low_trials[1], (A0, (1,))),
        low_trials[2]: running(db_url, low, low_trials[2], (A1, (0, 1))),
    }
    if checkpointed:
        for trial_id in low_trials:
            _checkpoint(db_url, trial_id)
    queue(db_url, high, [urgent], slots=2, priority=1)

    def decide_with_preemption() -> None:
        with session_scope(db_url) as session:
            cluster_queue.decide(
                session, pool, experiment_id=high, lease_s=30, processes_gone=lambda t: False
            )

    decide_with_preemption()
    with session_scope(db_url) as session:
        stopped = {
            run.trial_id: run.stop_reason
            for run in session.scalars(select(TrialRun))
            if run.stop_requested_at is not None
        }
    if not checkpointed:
        # Nothing has a checkpoint to resume from: the pool does not allow losing work.
        assert stopped == {}
        return
    # One 2-slot trial frees a whole agent; two 1-slot trials would be one too many.
    assert stopped == {low_trials[2]: f"preempted by trial {high}.0 (priority 1 over 42)"}
    assert reasons(db_url)[f"{high}.0"].endswith(f"preempting trial {low}.2 to make room")
    # While it stops, the next decision asks nobody else.
    decide_with_preemption()
    with session_scope(db_url) as session:
        asked = [r.trial_id for r in session.scalars(select(TrialRun)) if r.stop_requested_at]
    assert asked == [low_trials[2]]
    assert set(runs) == set(low_trials)


def test_the_decision_runs_on_postgresql(postgres_url: str) -> None:  # noqa: F811
    from storage import upgrade_schema

    upgrade_schema(postgres_url)
    low, low_trials = experiment(postgres_url, "low-pg", 3)
    high, (big,) = experiment(postgres_url, "high-pg", 1, priority=1, slots=4)
    queue(postgres_url, low, low_trials)
    queue(postgres_url, high, [big], slots=4, priority=1)
    (placed,) = decide(postgres_url, high)
    assert placed[0] == big
    assert reasons(postgres_url)[f"{low}.0"] == "no agent in pool default has 1 free slot"


ONE_SLOT = ResourcePool("default", (Agent("a0", "127.0.0.1", (0,)),))


def _decide_on(db_url: str, pool: ResourcePool, experiment_id: int) -> list[tuple[int, Any]]:
    with session_scope(db_url) as session:
        return cluster_queue.decide(
            session, pool, experiment_id=experiment_id, lease_s=30, processes_gone=lambda t: True
        )


def _slot_users(placed: list[tuple[int, Placement]]) -> dict[tuple[str, int], list[int]]:
    users: dict[tuple[str, int], list[int]] = {}
    for trial_id, placement in placed:
        for part in placement.agents:
            for slot in part.slots:
                users.setdefault((part.agent.name, slot), []).append(trial_id)
    return users


def test_a_resume_s_release_never_leaves_a_placement_that_shares_slots_with_a_new_one(
    db_url: str,
) -> None:
    # Issue 26, without processes: another search's decision places trial X of "mine";
    # X's driver is SIGKILLed before it starts X; the resume's recovery releases X's
    # claim (what `end_leftovers` does); the resumed driver queues Y and decides.
    mine, (x, y) = experiment(db_url, "mine", 2)
    other, _ = experiment(db_url, "other", 0)
    entry = cluster_queue.QueueEntry(trial_id=x, experiment_id=mine, pool=ONE_SLOT.name, slots=1)
    with session_scope(db_url) as session:
        cluster_queue.enqueue(session, [entry])
    assert _decide_on(db_url, ONE_SLOT, other) == []  # X is placed for its own driver
    with session_scope(db_url) as session:
        allocations.release(session, x)  # the resume ends X's leftovers
    with session_scope(db_url) as session:
        cluster_queue.enqueue(session, [entry, dataclasses.replace(entry, trial_id=y)])
    placed = _decide_on(db_url, ONE_SLOT, mine)
    # One trial on the one slot, and the ledger holds it for that trial.
    assert [users for users in _slot_users(placed).values() if len(users) > 1] == []
    assert len(placed) == 1
    with session_scope(db_url) as session:
        holders = {(a.agent, a.slot): a.trial_id for a in session.scalars(select(Allocation))}
    assert holders == {("a0", 0): placed[0][0]}


def test_a_placement_whose_claim_is_gone_waits_for_a_new_decision(db_url: str) -> None:
    # Whatever removed the claim (here: the rows deleted by hand), the placed row is
    # not handed out; it waits, and the next decision places it again.
    mine, (x,) = experiment(db_url, "mine", 1)
    other, _ = experiment(db_url, "other", 0)
    queue(db_url, mine, [x])
    assert decide(db_url, other) == []
    with session_scope(db_url) as session:
        session.execute(delete(Allocation))
    assert decide(db_url, mine) == []
    with session_scope(db_url) as session:
        row = session.get(QueuedTrial, x)
        assert row is not None and row.placement is None and row.claim_token is None
    ((placed_id, placement),) = decide(db_url, mine)
    assert placed_id == x
    with session_scope(db_url) as session:
        assert allocations.holds(session, x, placement, placement.token)


def test_releasing_a_claim_clears_its_placement_in_the_same_transaction(db_url: str) -> None:
    mine, (x,) = experiment(db_url, "mine", 1)
    other, _ = experiment(db_url, "other", 0)
    queue(db_url, mine, [x])
    decide(db_url, other)
    with session_scope(db_url) as session:
        row = session.get(QueuedTrial, x)
        assert row is not None and row.placement and row.claim_token
        allocations.release(session, x)
        session.flush()
        session.refresh(row)
        assert (row.placement, row.claim_token, row.reason) == (None, None, None)


def test_a_dead_driver_s_placed_trials_give_their_claims_back(db_url: str) -> None:
    dead, (x,) = experiment(db_url, "dead", 1)
    live, (y,) = experiment(db_url, "live", 1)
    queue(db_url, dead, [x])
    decide(db_url, live)  # places the dead experiment's X (its driver was alive then)
    with session_scope(db_url) as session:
        row = session.get(Experiment, dead)
        assert row is not None
        row.driver_heartbeat_at = utcnow() - _dt.timedelta(seconds=60)
    queue(db_url, live, [y])
    decide(db_url, live)
    with session_scope(db_url) as session:
        owners = {a.trial_id for a in session.scalars(select(Allocation))}
        assert session.get(QueuedTrial, x) is None
    assert owners == {y}
