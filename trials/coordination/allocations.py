"""Slot ownership in the database: which trial holds which slot, under a renewable lease.

Every held slot is one ``storage.Allocation`` row per claim on it. A whole-slot claim's
row (``eighths`` 8) is unique per (resource pool, agent, slot). That unique key, plus
claiming all of a placement's slots in one transaction (SQLite runs every transaction
as ``BEGIN IMMEDIATE``; on PostgreSQL :func:`claim` takes the ledger's advisory lock,
the placement decision's), is what stops two drivers sharing a slot: the second claimer
sees the first's rows or hits the constraint, and writes nothing.

A trial on a share of one slot (``resources.slots_per_trial`` 0.5, 0.25, 0.125) holds a
row of ``eighths`` 4, 2 or 1 on that slot. A claim is admitted only while the rows of
each of its slots, its own included, add up to at most one slot (8 eighths) and a
whole-slot row shares its slot with nothing: so no slot is ever claimed past its
capacity, and a share and a whole trial never share a slot. Shares are fenced, leased,
renewed, released and reclaimed exactly as whole slots are, row by row.

A driver renews its leases while it runs (:func:`renew_leases`). One that dies leaves
rows whose lease runs out. An expired lease alone does not free a slot: the dead
driver's trial may still be training on it (its processes outlive the driver). So
:func:`reclaim_stale` deletes an expired row only once the caller has confirmed that
the processes of its trial are gone and that none can still start; until then the slot
stays held, and :func:`claim` never takes over a row, expired or not.

Every claim is fenced. :func:`claim` gives it a fresh token, which the placement
carries to the trial's driver (:class:`ClaimedPlacement`); the launch re-checks it
(:func:`confirm_claim`) in the transaction that records the trial's run. A driver
stopped between the decision and the launch (SIGSTOP, a suspended machine) whose claim
was reclaimed meanwhile, and perhaps given to another trial, finds no row with its
token and starts nothing. That is what makes reclaiming a claim without a run safe: its
owner can no longer record one. Releasing a claim (:func:`release`,
:func:`release_claim`, :func:`reclaim_stale`) clears the queue placement made with it
in the same transaction, so no placement outlives its claim.

Example:
    >>> from storage import TrialRun, session_scope, utcnow
    >>> from trials.scheduler import AgentSlots, Placement
    >>> parts = (AgentSlots(pool.agents[0], (0, 1)),)
    >>> placement = Placement(1, pool.name, parts)
    >>> with session_scope(url) as session:
    ...     reclaim_stale(session, utcnow(), processes_gone=lambda trial_id: True)
    ...     free = free_slots(session, pool)
    ...     token = claim(session, placement, trial_id=1, experiment_id=1, lease_s=30.0)
    []
    >>> free
    {'local': frozenset({0, 1})}
    >>> with session_scope(url) as session:
    ...     confirm_claim(session, 1, ClaimedPlacement(1, pool.name, parts, token=token), 30.0)
    ...     session.add(TrialRun(trial_id=1, attempt=0))
    >>> with session_scope(url) as session:
    ...     free_slots(session, pool)
    {'local': frozenset()}
"""

from __future__ import annotations

import datetime as _dt
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    delete,
    func,
    null,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage import Allocation, Experiment, QueuedTrial, Trial, WarmJob, utcnow
from trials.config import EIGHTHS_PER_SLOT
from trials.scheduler import Cluster, Placement, ResourcePool

# Any fixed 64-bit key, distinct from the schema lock's (storage._lock): the one lock of
# every placement decision and every claim (trials.coordination.cluster_queue takes it).
_PG_LEDGER_LOCK_KEY = 0x510754EEA

WARM_RUNNING = "running"
"""A warm job's state in :attr:`SlotHolder.warm_state`: it runs the slot's trial."""
WARM_RESERVED = "reserved"
"""A decision reserved the idle job for the slot's trial; its driver hands it over next."""
WARM_IDLE = "idle"
"""The job's ranks wait for the next trial of their shape; no trial holds the slot."""
WARM_ENDING = "ending"
"""The job was asked to end (or has ended): its slots free once its processes are gone."""


class ClaimLostError(RuntimeError):
    """The claim behind a placement is gone or was taken over: nothing may start on it.

    Its driver was stopped for longer than the lease (or its claim was released by a
    resume), and another decision may have given the slots to another trial.
    """

    def __init__(self, trial_id: int, placement: Placement) -> None:
        self.trial_id = trial_id
        where = "; ".join(
            f"{part.agent.name} slots {','.join(str(slot) for slot in part.slots)}"
            for part in placement.agents
        )
        super().__init__(
            f"the slot claim for trial {trial_id} on {where} is gone or was taken over"
        )


@dataclass(frozen=True)
class ClaimedPlacement(Placement):
    """A placement whose slots the ledger holds for its trial under the claim ``token``.

    What a placement decision hands the trial's driver. The launch re-checks the token
    (:func:`confirm_claim`) in the transaction that records the run; ``None`` stands
    for a claim made before claims had tokens.
    """

    token: str | None = None


@dataclass(frozen=True)
class SlotHolder:
    """One slot of the cluster and who holds it (see :attr:`held`).

    A slot of a warm job (``resources.reuse_workers``) carries ``warm_job_id`` and
    ``warm_state``. Its trial is the one running on the job, or reserved to run on it
    next; an idle or ending job holds the slot without a trial (``trial_id`` and
    ``trial_number`` are None), since the last trial it ran has finished.
    """

    pool: str
    agent: str
    host: str
    slot: int
    experiment_id: int | None = None
    trial_id: int | None = None
    experiment_name: str | None = None
    trial_number: int | None = None
    allocated_at: _dt.datetime | None = None
    lease_expires_at: _dt.datetime | None = None
    stale: bool = False
    """The holder's lease ran out (its driver stopped renewing); the slot is freed once
    the trial's processes are confirmed gone."""
    warm_job_id: int | None = None
    warm_state: str | None = None
    """:data:`WARM_RUNNING`, :data:`WARM_RESERVED`, :data:`WARM_IDLE` or
    :data:`WARM_ENDING` for a warm job's slot, else None."""
    eighths: int = EIGHTHS_PER_SLOT
    """How much of the slot this holder has, in eighths (8: all of it); for a free entry,
    how much is free. A shared slot appears once per share on it, and once more for
    what is left of it, if anything."""

    @property
    def held(self) -> bool:
        """Whether a trial or a warm job holds the slot (False: the slot is free)."""
        return self.trial_id is not None or self.warm_job_id is not None


def warm_state_column() -> ColumnElement[str | None]:
    """SQL for :attr:`SlotHolder.warm_state` of an ``Allocation`` row outer-joined to
    its ``WarmJob`` (``WarmJob.id == Allocation.warm_job_id``): one of the ``WARM_*``
    states, None for a slot of no warm job.

    A job asked to end stays :data:`WARM_RUNNING` until its trial is over (its ranks
    exit after it); a reservation for a job that ends is void. A slot whose job row is
    gone counts as ending: only the job's end frees it.
    """
    return case(
        (Allocation.warm_job_id.is_(None), null()),
        (or_(WarmJob.id.is_(None), WarmJob.ended_at.is_not(None)), WARM_ENDING),
        (WarmJob.current_trial_id.is_not(None), WARM_RUNNING),
        (WarmJob.end_requested_at.is_not(None), WARM_ENDING),
        (WarmJob.reserved_trial_id.is_not(None), WARM_RESERVED),
        else_=WARM_IDLE,
    )


def trial_holds(warm_state: str | None) -> bool:
    """Whether a slot in ``warm_state`` is held by its ledger row's trial.

    An idle or ending warm job's row keeps the last trial the job ran, which is over.
    """
    return warm_state in (None, WARM_RUNNING, WARM_RESERVED)


@dataclass(frozen=True)
class LedgerState:
    """What the ledger leaves of a pool: free slots, and the room on shared slots.

    ``free`` maps each agent to its slot ids no row holds; ``shared`` each agent (with
    some) to its slots that shares hold, and the eighths they hold there, as the
    scheduler core takes them (:class:`~trials.scheduler.SlotScheduler`).
    """

    free: dict[str, frozenset[int]]
    shared: dict[str, dict[int, int]]


def ledger_state(session: Session, pool: ResourcePool) -> LedgerState:
    """The pool's free slots and shared slots as the ledger holds them now.

    Run :func:`reclaim_stale` first: a row whose lease expired still holds its slot
    until it is reclaimed. Rows of agents the pool does not declare (another driver's
    cluster file) are left out.
    """
    held: dict[str, set[int]] = defaultdict(set)
    shares: dict[str, dict[int, int]] = defaultdict(dict)
    whole: set[tuple[str, int]] = set()
    rows = session.execute(
        select(Allocation.agent, Allocation.slot, Allocation.eighths).where(
            Allocation.resource_pool == pool.name
        )
    )
    for agent, slot, eighths in rows:
        held[agent].add(slot)
        if eighths >= EIGHTHS_PER_SLOT:
            whole.add((agent, slot))
        else:
            shares[agent][slot] = shares[agent].get(slot, 0) + eighths
    declared = {agent.name: agent for agent in pool.agents}
    shared = {
        agent: {
            slot: min(EIGHTHS_PER_SLOT, used)
            for slot, used in slots.items()
            if (agent, slot) not in whole and slot in declared[agent].slots
        }
        for agent, slots in shares.items()
        if agent in declared
    }
    return LedgerState(
        free={a.name: frozenset(set(a.slots) - held[a.name]) for a in pool.agents},
        shared={agent: slots for agent, slots in shared.items() if slots},
    )


def free_slots(session: Session, pool: ResourcePool) -> dict[str, frozenset[int]]:
    """Each agent's slot ids that no allocation row holds (a shared slot is not free).

    Run :func:`reclaim_stale` first: a row whose lease expired still holds its slot
    until it is reclaimed.
    """
    return ledger_state(session, pool).free


def lock_ledger(session: Session) -> None:
    """Make the caller's transaction the only one claiming slots (and deciding placements).

    SQLite needs nothing more: every slotsweep transaction begins ``IMMEDIATE``, so it
    holds the database's write lock from its first statement. On PostgreSQL a
    transaction-scoped advisory lock: a share is admitted by reading what its slot
    holds, and no unique key can say "at most one slot in all", so two claims must not
    read the same slot at once. Taking it again in the same transaction is free.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LEDGER_LOCK_KEY})


def slot_has_room(held: Collection[int], eighths: int) -> bool:
    """Whether a claim of ``eighths`` fits beside claims of ``held`` eighths on one slot.

    A whole-slot claim (8) needs the slot empty; a share needs no whole claim there and
    the shares to add up to at most one slot.

    Example:
        >>> slot_has_room([4, 2], 2), slot_has_room([4, 2], 4), slot_has_room([], 8)
        (True, False, True)
        >>> slot_has_room([8], 1), slot_has_room([1], 8)
        (False, False)
    """
    if not held:
        return True
    if eighths >= EIGHTHS_PER_SLOT or EIGHTHS_PER_SLOT in held:
        return False
    return sum(held) + eighths <= EIGHTHS_PER_SLOT


def claim(
    session: Session, placement: Placement, *, trial_id: int, experiment_id: int, lease_s: float
) -> str | None:
    """Hold every slot of ``placement`` (or its share of its one slot) for ``trial_id``, or
    none of them; the claim's token.

    Returns None, having written nothing, when any of the slots has no room for it
    (:func:`slot_has_room`), including because of another driver that claimed it a
    moment earlier or under an expired lease that :func:`reclaim_stale` has not
    released. Runs in a savepoint of the caller's transaction, under the ledger's lock
    (:func:`lock_ledger`); the caller commits (``session_scope`` does). The token is new
    for every claim, so a launch can tell its own claim from a later one of the same trial.
    """
    now = utcnow()
    token = new_claim_token()
    eighths = placement.eighths
    wanted = {(part.agent.name, slot) for part in placement.agents for slot in part.slots}
    agents = {part.agent.name for part in placement.agents}
    lock_ledger(session)
    savepoint = session.begin_nested()
    try:
        existing = [
            row
            for row in session.scalars(
                select(Allocation).where(
                    Allocation.resource_pool == placement.pool, Allocation.agent.in_(agents)
                )
            )
            if (row.agent, row.slot) in wanted
        ]
        others: dict[tuple[str, int], list[int]] = {key: [] for key in wanted}
        for row in existing:
            if row.trial_id != trial_id:
                others[row.agent, row.slot].append(row.eighths)
        if not all(slot_has_room(held, eighths) for held in others.values()):
            savepoint.rollback()
            return None
        # The trial's own rows (a claim whose commit was retried) are replaced.
        for row in existing:
            if row.trial_id == trial_id:
                session.delete(row)
        # Deletes must reach the database before the inserts that reuse their keys
        # (one flush would insert first).
        session.flush()
        expires = now + _dt.timedelta(seconds=lease_s)
        session.add_all(
            Allocation(
                resource_pool=placement.pool,
                agent=part.agent.name,
                host=part.agent.host,
                slot=slot,
                eighths=eighths,
                trial_id=trial_id,
                experiment_id=experiment_id,
                allocated_at=now,
                lease_expires_at=expires,
                claim_token=token,
            )
            for part in placement.agents
            for slot in part.slots
        )
        session.flush()
    except IntegrityError as exc:
        savepoint.rollback()
        if _is_unique_violation(exc):
            return None  # another driver's insert won the race (PostgreSQL)
        raise
    savepoint.commit()
    return token


def new_claim_token() -> str:
    """A fresh claim token (:func:`claim`, and a warm job's reservation)."""
    return uuid.uuid4().hex


def holds(session: Session, trial_id: int, placement: Placement, token: str | None) -> bool:
    """Whether the ledger holds every slot of ``placement`` for ``trial_id`` under ``token``."""
    rows = session.execute(
        select(Allocation.resource_pool, Allocation.agent, Allocation.slot).where(
            Allocation.trial_id == trial_id, _of_claim(token)
        )
    )
    held = {(pool, agent, slot) for pool, agent, slot in rows}
    return _slot_keys(placement) <= held


def confirm_claim(
    session: Session, trial_id: int, placement: ClaimedPlacement, lease_s: float
) -> None:
    """Check that the claim behind ``placement`` still holds, and renew its lease.

    Call it in the transaction that records the trial's run, before the run: when it
    raises :class:`ClaimLostError` the caller's transaction must roll back, and the
    trial starts nothing. The update comes before the check so that, on PostgreSQL, it
    locks the claim's rows: a decision reclaiming them concurrently either deleted them
    first (this finds none) or waits for this transaction (:func:`reclaim_stale` locks
    what it judges) and then sees the recorded run and the renewed lease. SQLite's
    ``BEGIN IMMEDIATE`` serialises the two.
    """
    session.execute(
        update(Allocation)
        .where(Allocation.trial_id == trial_id, _of_claim(placement.token))
        .values(lease_expires_at=utcnow() + _dt.timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    if not holds(session, trial_id, placement, placement.token):
        raise ClaimLostError(trial_id, placement)


def release(session: Session, trial_id: int) -> None:
    """Free every slot ``trial_id`` holds (it finished, failed or was never launched).

    Slots of a warm job stay held: its processes may outlive the trial, and they are
    freed with the job (:func:`trials.coordination.warm_jobs.close_job`) once those are gone. A
    queue placement made with a released claim is cleared with it.
    """
    _release(session, and_(Allocation.trial_id == trial_id, Allocation.warm_job_id.is_(None)))


def release_claim(session: Session, trial_id: int, token: str | None) -> None:
    """Free what is left of one claim of ``trial_id`` (a launch found it lost or broken).

    A later claim of the same trial, under another token, is left alone.
    """
    _release(
        session,
        and_(
            Allocation.trial_id == trial_id,
            _of_claim(token),
            Allocation.warm_job_id.is_(None),
        ),
    )


def _release(session: Session, rows: ColumnElement[bool]) -> None:
    """Delete the ledger ``rows`` and clear the queue placements of their claims.

    One transaction does both, whoever releases (a finished trial, a resume ending a
    dead driver's leftovers, a reclaim): a placement whose claim is gone would otherwise
    be handed to its driver while another decision gives the same slots to another
    trial.
    """
    claims = session.execute(
        select(Allocation.trial_id, Allocation.claim_token).where(rows).distinct()
    ).all()
    if not claims:
        return
    session.execute(delete(Allocation).where(rows).execution_options(synchronize_session=False))
    for trial_id, token in claims:
        unplace(
            session,
            trial_id,
            QueuedTrial.placement.is_not(None),
            QueuedTrial.claim_token.is_not_distinct_from(token),
        )


def unplace(session: Session, trial_id: int, *conditions: ColumnElement[bool]) -> None:
    """Clear the queue placement of ``trial_id`` (where ``conditions`` hold): it waits again.

    Its claim's token goes with it, and the reason, which the next decision writes.
    """
    session.execute(
        update(QueuedTrial)
        .where(QueuedTrial.trial_id == trial_id, *conditions)
        # SQL NULL, not JSON null: "placed" means the column is set.
        .values(placement=null(), claim_token=None, reason=None)
        .execution_options(synchronize_session=False)
    )


def _of_claim(token: str | None) -> ColumnElement[bool]:
    """The ledger rows of the claim ``token`` (None: rows written before tokens existed)."""
    return Allocation.claim_token.is_not_distinct_from(token)


def _slot_keys(placement: Placement) -> set[tuple[str, str, int]]:
    return {
        (placement.pool, part.agent.name, slot) for part in placement.agents for slot in part.slots
    }


def held_counts(
    session: Session, *, trial_ids: Collection[int] = (), warm_job_ids: Collection[int] = ()
) -> dict[int, int]:
    """How many slots the ledger holds for each of ``trial_ids``, or each of ``warm_job_ids``.

    Give one of the two; an id the ledger holds nothing for is absent.
    """
    column = Allocation.trial_id if trial_ids else Allocation.warm_job_id
    ids = list(trial_ids or warm_job_ids)
    if not ids:
        return {}
    rows = session.execute(select(column, func.count()).where(column.in_(ids)).group_by(column))
    return {key: int(count) for key, count in rows if key is not None}


def renew_leases(session: Session, experiment_id: int, lease_s: float) -> None:
    """Extend the lease of every slot the experiment's trials hold to ``lease_s`` from now."""
    session.execute(
        update(Allocation)
        .where(Allocation.experiment_id == experiment_id)
        .values(lease_expires_at=utcnow() + _dt.timedelta(seconds=lease_s))
    )


def reclaim_stale(
    session: Session, now: _dt.datetime, processes_gone: Callable[[int], bool]
) -> list[int]:
    """Release expired allocations whose trial's processes are gone; those trials' ids.

    ``processes_gone(trial_id)`` is asked once per trial with an expired lease; a trial
    whose processes still run, may still start (a run recorded whose driver may yet
    start it) or cannot be checked keeps its slots, so no second trial is ever placed
    on a slot that is busy. A claim with no run needs nothing more: its owner's launch
    checks the claim's token, which is gone with the rows.

    The expired rows are locked before they are judged (PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` serialises anyway): a launch confirming one of these claims, or
    a heartbeat renewing it, in a concurrent transaction has committed by then, and
    the judgement sees its run and its renewed lease. Judged on what was read before
    that commit, a claim whose run had just been recorded would look runless.
    """
    expired = Allocation.lease_expires_at <= now
    locked = session.execute(
        select(Allocation.id, Allocation.trial_id).where(expired).with_for_update()
    ).all()
    candidates = sorted({trial_id for _, trial_id in locked})
    reclaimed = [trial_id for trial_id in candidates if processes_gone(trial_id)]
    if reclaimed:
        _release(session, and_(Allocation.trial_id.in_(reclaimed), expired))
    return reclaimed


def holders(
    session: Session, cluster: Cluster | None = None, now: _dt.datetime | None = None
) -> list[SlotHolder]:
    """Every slot and its holder, for ``slotsweep task list``.

    With ``cluster``, every slot of every declared agent appears (free ones without a
    holder), followed by held slots of agents the cluster does not declare (another
    driver's cluster file). Without it, only held slots. A warm job's slot names the
    job and its state; while the job is idle it names no trial (the ledger row keeps
    the last trial the job ran, which has finished). A shared slot appears once per
    share on it (:attr:`SlotHolder.eighths`, the largest share first) and, where shares
    leave room, once more without a holder for what is free.
    """
    now = utcnow() if now is None else now
    rows = session.execute(
        select(Allocation, Experiment.name, Trial.optuna_trial_number, warm_state_column())
        .outerjoin(Experiment, Experiment.id == Allocation.experiment_id)
        .outerjoin(Trial, Trial.id == Allocation.trial_id)
        .outerjoin(WarmJob, WarmJob.id == Allocation.warm_job_id)
        .order_by(
            Allocation.resource_pool,
            Allocation.agent,
            Allocation.slot,
            Allocation.eighths.desc(),
            Allocation.id,
        )
    ).all()
    held: dict[tuple[str, str, int], list[SlotHolder]] = defaultdict(list)
    for row, name, number, state in rows:
        held[row.resource_pool, row.agent, row.slot].append(_holder(row, name, number, state, now))
    result: list[SlotHolder] = []
    if cluster is not None:
        for pool, agent in cluster.agents:
            for slot in agent.slots:
                on_slot = held.pop((pool.name, agent.name, slot), [])
                result += on_slot
                left = EIGHTHS_PER_SLOT - sum(holder.eighths for holder in on_slot)
                if left > 0:
                    free = SlotHolder(pool.name, agent.name, agent.host, slot, eighths=left)
                    result.append(free)
    for on_slot in held.values():
        result += on_slot
    return result


def _holder(
    row: Allocation,
    experiment_name: str | None,
    trial_number: int | None,
    state: str | None,
    now: _dt.datetime,
) -> SlotHolder:
    """The holder of one ledger row; a warm job's slot with its job's state."""
    with_trial = trial_holds(state)
    return SlotHolder(
        pool=row.resource_pool,
        agent=row.agent,
        host=row.host,
        slot=row.slot,
        experiment_id=row.experiment_id,
        trial_id=row.trial_id if with_trial else None,
        experiment_name=experiment_name,
        trial_number=trial_number if with_trial else None,
        allocated_at=row.allocated_at,
        lease_expires_at=row.lease_expires_at,
        stale=row.lease_expires_at <= now,
        warm_job_id=row.warm_job_id,
        warm_state=state,
        eighths=row.eighths,
    )


def _is_unique_violation(exc: IntegrityError) -> bool:
    orig = exc.orig
    # PostgreSQL's unique_violation (psycopg 3 calls it sqlstate, psycopg2 pgcode).
    if "23505" in (getattr(orig, "sqlstate", None), getattr(orig, "pgcode", None)):
        return True
    return "UNIQUE constraint failed" in str(orig)
