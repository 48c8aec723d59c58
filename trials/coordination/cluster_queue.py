"""One queue for every search sharing a database: the cluster-wide placement decision.

Each driver puts its experiment's waiting trials in ``storage.QueuedTrial`` (pool,
size, priority, fair-share weight, arrival). A placement decision (:func:`decide`) is
made by whichever driver has a trial waiting, one decision at a time: SQLite runs every
slotsweep transaction as ``BEGIN IMMEDIATE`` (one writer), PostgreSQL takes a
transaction-scoped advisory lock. Inside that transaction the decision

1. drops the rows of experiments whose driver stopped or died (a stale heartbeat: its
   running trials keep their slots until their processes are gone, as always);
2. reads the pool's free slots and its shared slots' room from the slot ledger
   (:mod:`trials.coordination.allocations`) and the slots each experiment holds (a share
   of a slot at its fraction);
3. runs the one scheduler core (:class:`~trials.scheduler.SlotScheduler`) over the
   whole queue: priority, fair share among experiments of equal priority (Determined's
   fair-share scheduler: ``held / weight`` lowest first), FIFO, best/worst fit, gang
   scheduling, whole-agent fits, packing shares of one slot and the backfilling
   reservation;
4. claims the slots of every placement, whichever experiment it belongs to (the
   ledger row carries the trial and experiment; the owner's heartbeat renews it), and
   writes the placement and the claim's token on the queue row;
5. with ``preemption: true`` in the pool, asks the fewest lower-priority running trials
   that let the blocked head fit to checkpoint and stop;
6. writes each waiting trial's reason in plain words.

The calling driver gets back the placed trials of its own experiment (placed by this
decision or an earlier one of another driver) and starts them; every other driver
starts its own on its next tick. A placed row is handed out only while the ledger
still holds every one of its slots for its trial under its claim's token; one whose
claim is gone goes back to waiting. The launch checks the token once more, in the
transaction that records the run (:func:`trials.coordination.allocations.confirm_claim`).

Example (experiment 1's driver is alive: a dead driver's trials leave the queue):

    >>> from storage import Experiment, session_scope, utcnow
    >>> with session_scope(url) as session:
    ...     session.get(Experiment, 1).driver_heartbeat_at = utcnow()
    >>> with session_scope(url) as session:
    ...     enqueue(session, [QueueEntry(trial_id=1, experiment_id=1, pool="default",
    ...                                  slots=2, priority=42, weight=1.0)])
    ...     mine = decide(session, pool, experiment_id=1, lease_s=30.0,
    ...                   processes_gone=lambda trial_id: True)
    >>> [(trial_id, placement.slots) for trial_id, placement in mine]
    [(1, 2)]
"""

from __future__ import annotations

import datetime as _dt
from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, or_, select, true, update
from sqlalchemy.orm import Session

from storage import (
    Allocation,
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    QueuedTrial,
    Trial,
    TrialRun,
    utcnow,
)
from trials.config import (
    DEFAULT_PRIORITY,
    DEFAULT_WEIGHT,
    EIGHTHS_PER_SLOT,
    ResourcesConfig,
    StoredConfigError,
    read_stored_config,
    slot_share_of,
)
from trials.coordination import allocations as slot_ledger
from trials.coordination import warm_jobs
from trials.coordination.allocations import ClaimedPlacement
from trials.coordination.attempts import request_stop
from trials.labels import trial_label
from trials.scheduler import (
    Agent,
    AgentSlots,
    Placement,
    ResourcePool,
    RunningRequest,
    SlotRequest,
    SlotScheduler,
    Unschedulable,
    choose_preemptions,
)

NOT_DECIDED_YET = "waiting for the next placement decision"
"""Why a queued trial of a running search waits before any decision has looked at it."""

# Why a QUEUED trial of an experiment no driver runs waits: it has no queue row (its
# driver left the queue when it stopped), so no decision will place it.
_NO_DRIVER = {
    ExperimentState.PAUSED: "experiment paused",
    ExperimentState.COMPLETED: "experiment completed",
    ExperimentState.CANCELED: "experiment killed",
    ExperimentState.ERROR: "experiment stopped",
}


@dataclass(frozen=True)
class QueueEntry:
    """A trial its driver puts in the queue."""

    trial_id: int
    experiment_id: int
    pool: str
    slots: int
    priority: int = DEFAULT_PRIORITY
    weight: float = DEFAULT_WEIGHT
    #: Of each slot, in eighths: 8 whole slots, 4/2/1 a share of one slot.
    eighths: int = EIGHTHS_PER_SLOT


@dataclass(frozen=True)
class QueuedView:
    """One queued trial as ``slotsweep task list``, ``describe`` and the UI show it."""

    pool: str
    experiment_id: int
    experiment_name: str
    trial_id: int
    trial_number: int
    slots: int
    priority: int
    weight: float
    queued_at: _dt.datetime
    placed_on: tuple[str, ...]
    """The agents a decision placed it on (its driver starts it at its next tick)."""
    reason: str | None
    share: float = 1.0
    """The share of its one slot it waits for (1.0: ``slots`` whole slots)."""

    @property
    def label(self) -> str:
        return trial_label(self.experiment_id, self.trial_number)

    @property
    def shown_reason(self) -> str:
        """Why it waits, as ``task list``, ``describe`` and the UI show it.

        Example:
            >>> import dataclasses, datetime as dt
            >>> view = QueuedView("default", 2, "big", 5, 0, 4, 1, 1.0, dt.datetime(2025, 1, 1),
            ...                   (), "no agent in pool default has 2 free slots")
            >>> view.shown_reason
            'no agent in pool default has 2 free slots'
            >>> dataclasses.replace(view, placed_on=("a0", "a1")).shown_reason
            'placed on a0, a1; starting'
        """
        if self.placed_on:
            return f"placed on {', '.join(self.placed_on)}; starting"
        return self.reason or NOT_DECIDED_YET


def waiting_reason(view: QueuedView | None, experiment_state: ExperimentState | str) -> str:
    """Why a QUEUED trial waits: its queue row's reason, or why it has no row.

    A trial of a running search has a row once its driver's next tick queues it; the
    trials of a paused (or ended) experiment have none, since its driver took them out.

    Example:
        >>> waiting_reason(None, ExperimentState.PAUSED)
        'experiment paused'
        >>> waiting_reason(None, "ACTIVE")
        'waiting for the next placement decision'
    """
    if view is not None:
        return view.shown_reason
    return _NO_DRIVER.get(ExperimentState(experiment_state), NOT_DECIDED_YET)


def enqueue(session: Session, entries: Sequence[QueueEntry]) -> None:
    """Add ``entries`` to the queue; a trial already queued keeps its row (and placement)."""
    if not entries:
        return
    present = set(
        session.scalars(
            select(QueuedTrial.trial_id).where(
                QueuedTrial.trial_id.in_([entry.trial_id for entry in entries])
            )
        )
    )
    now = utcnow()
    session.add_all(
        QueuedTrial(
            trial_id=entry.trial_id,
            experiment_id=entry.experiment_id,
            resource_pool=entry.pool,
            slots=entry.slots,
            eighths=entry.eighths,
            priority=entry.priority,
            weight=entry.weight,
            queued_at=now,
        )
        for entry in entries
        if entry.trial_id not in present
    )
    session.flush()


def leave(session: Session, experiment_id: int) -> None:
    """Take the experiment's trials out of the queue (its driver pauses, ends or dies).

    Slots a decision claimed for trials that never started go back to the ledger.
    """
    placed = list(
        session.scalars(
            select(QueuedTrial.trial_id).where(
                QueuedTrial.experiment_id == experiment_id, QueuedTrial.placement.is_not(None)
            )
        )
    )
    for trial_id in placed:
        slot_ledger.release(session, trial_id)
    session.execute(delete(QueuedTrial).where(QueuedTrial.experiment_id == experiment_id))


def lock_queue(session: Session) -> None:
    """Make the caller's transaction the only placement decision running.

    The decision's lock is the slot ledger's (:func:`trials.coordination.allocations.lock_ledger`):
    a decision claims slots, and claims are made one at a time.
    """
    slot_ledger.lock_ledger(session)


def decide(
    session: Session,
    pool: ResourcePool,
    *,
    experiment_id: int,
    lease_s: float,
    processes_gone: Callable[[int], bool],
    unavailable_agents: Collection[str] = (),
    now: _dt.datetime | None = None,
) -> list[tuple[int, ClaimedPlacement]]:
    """Place the whole queue of ``pool`` once; the placed trials of ``experiment_id``.

    Runs in the caller's transaction (``session_scope``: the caller commits). The
    returned trials' queue rows are deleted: the caller starts them now (the launch
    confirms each claim's token), or gives their slots back
    (:func:`trials.coordination.allocations.release`) and queues them again.
    ``processes_gone(trial_id)`` confirms an expired lease's trial has ended
    (:func:`trials.coordination.allocations.reclaim_stale`); ``unavailable_agents`` take no
    trial (a lost or drained node).
    """
    now = utcnow() if now is None else now
    lock_queue(session)
    _drop_dead_experiments(session, now, lease_s)
    slot_ledger.reclaim_stale(session, now, processes_gone=processes_gone)
    state = slot_ledger.ledger_state(session, pool)
    free, shared = state.free, state.shared
    if unavailable_agents:
        free = {
            name: frozenset() if name in unavailable_agents else slots
            for name, slots in free.items()
        }
        # Its shared slots then take no share either: neither free nor shared, they
        # count as held.
        shared = {name: slots for name, slots in shared.items() if name not in unavailable_agents}
    # What is left, in eighths of a slot (free slots and the room on shared slots).
    left = EIGHTHS_PER_SLOT * sum(len(slots) for slots in free.values()) + sum(
        EIGHTHS_PER_SLOT - used for slots in shared.values() for used in slots.values()
    )
    idle = warm_jobs.idle_jobs(session, pool.name)
    # Per (experiment, size, priority) the trials wait in arrival order, and no
    # decision can place more of a size than what is left holds: only those, plus one
    # to stand for the rest of its class, need to reach the scheduler. A queue of
    # 10,000 costs a decision a few dozen rows, not 10,000.
    position = (
        func.row_number()
        .over(
            partition_by=(
                QueuedTrial.experiment_id,
                QueuedTrial.slots,
                QueuedTrial.eighths,
                QueuedTrial.priority,
            ),
            order_by=QueuedTrial.trial_id,
        )
        .label("position")
    )
    waiting = (
        select(
            QueuedTrial.trial_id,
            QueuedTrial.experiment_id,
            QueuedTrial.slots,
            QueuedTrial.priority,
            QueuedTrial.weight,
            QueuedTrial.eighths,
            position,
        )
        .where(QueuedTrial.resource_pool == pool.name, QueuedTrial.placement.is_(None))
        .subquery()
    )
    rows = session.execute(
        select(
            waiting.c.trial_id,
            waiting.c.experiment_id,
            waiting.c.slots,
            waiting.c.priority,
            waiting.c.weight,
            waiting.c.eighths,
        ).where(
            # An idle warm job's slots may go to a waiting trial of its shape too.
            (waiting.c.position - 1) * waiting.c.slots * waiting.c.eighths
            <= left + EIGHTHS_PER_SLOT * sum(job.slots for job in idle)
        )
    ).all()
    held_back = _held_back_for_warm_jobs(rows, idle)
    placeable = [row for row in rows if row.trial_id not in held_back]
    if placeable:
        _place(session, pool, free, shared, placeable, now=now, lease_s=lease_s)
    if idle:
        _settle_warm_jobs(session, rows, held_back, idle, now=now)
    return _take_placed(session, pool, experiment_id)


def _held_back_for_warm_jobs(rows: Sequence[Any], idle: Sequence[warm_jobs.IdleJob]) -> set[int]:
    """The first waiting trials of each idle warm job's shape, one per job.

    They are kept out of the scheduler's pass, so free slots elsewhere do not start
    them cold while a job of their shape waits for them.
    """
    jobs_per_shape: dict[tuple[int, int], int] = defaultdict(int)
    for job in idle:
        jobs_per_shape[(job.experiment_id, job.slots)] += 1
    held: set[int] = set()
    for row in sorted(rows, key=lambda row: (row.priority, row.trial_id)):
        shape = (row.experiment_id, row.slots)
        if jobs_per_shape.get(shape, 0) > 0:
            jobs_per_shape[shape] -= 1
            held.add(row.trial_id)
    return held


def _settle_warm_jobs(
    session: Session,
    rows: Sequence[Any],
    held_back: set[int],
    idle: Sequence[warm_jobs.IdleJob],
    *,
    now: _dt.datetime,
) -> None:
    """Reserve each idle warm job for a waiting trial of its shape, or ask it to end."""
    ids = [row.trial_id for row in rows]
    unplaced = set(
        session.scalars(
            select(QueuedTrial.trial_id).where(
                QueuedTrial.trial_id.in_(ids), QueuedTrial.placement.is_(None)
            )
        )
    )
    waiting = [
        warm_jobs.WaitingTrial(row.trial_id, row.experiment_id, row.slots, row.priority)
        for row in rows
        if row.trial_id in unplaced
    ]
    labels = warm_jobs.trial_numbers(session, [trial.trial_id for trial in waiting])
    match = warm_jobs.match_idle_jobs(idle, waiting, label=labels.get)
    for job_id, trial_id in match.reserved.items():
        warm_jobs.reserve(session, job_id, trial_id, now)
    for job_id, reason in match.ending.items():
        warm_jobs.request_end(session, job_id, reason)
    reserved = set(match.reserved.values())
    for trial_id in held_back - reserved:
        session.execute(
            update(QueuedTrial)
            .where(QueuedTrial.trial_id == trial_id)
            .values(reason="a warm job's slots are being freed for it", decided_at=now)
        )


def _drop_dead_experiments(session: Session, now: _dt.datetime, lease_s: float) -> None:
    """Delete the queue rows of experiments no live driver runs.

    A dead driver's heartbeat stops; after ``lease_s`` its queued trials leave the
    queue, and the claims of those a decision had placed are released with them: the
    driver took none of them (taking deletes the row), so none can start.
    """
    cutoff = now - _dt.timedelta(seconds=lease_s)
    dead = select(Experiment.id).where(
        or_(
            Experiment.state != ExperimentState.ACTIVE,
            Experiment.driver_heartbeat_at.is_(None),
            Experiment.driver_heartbeat_at < cutoff,
        )
    )
    placed = session.execute(
        select(QueuedTrial.trial_id, QueuedTrial.claim_token).where(
            QueuedTrial.experiment_id.in_(dead), QueuedTrial.placement.is_not(None)
        )
    ).all()
    for trial_id, token in placed:
        slot_ledger.release_claim(session, trial_id, token)
    session.execute(
        delete(QueuedTrial)
        .where(QueuedTrial.experiment_id.in_(dead))
        .execution_options(synchronize_session=False)
    )


# (experiment, slots, eighths of each, priority): trials that wait alike.
_Class = tuple[int, int, int, int]


@dataclass
class _Submitted:
    """What one decision submitted to the scheduler, by trial and by experiment."""

    requests: dict[int, SlotRequest] = field(default_factory=dict)
    experiment_of: dict[int, int] = field(default_factory=dict)
    weights: dict[int, float] = field(default_factory=dict)
    #: Trials the scheduler refused, and why (another cluster file's pool).
    unschedulable: dict[int, str] = field(default_factory=dict)
    #: Slots submitted per experiment (a share at its fraction).
    slots_by_experiment: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def _place(
    session: Session,
    pool: ResourcePool,
    free: dict[str, frozenset[int]],
    shared: dict[str, dict[int, int]],
    rows: Sequence[Any],
    *,
    now: _dt.datetime,
    lease_s: float,
) -> None:
    """One decision over ``rows`` (each class's first trials); claims and reasons."""
    scheduler = SlotScheduler(pool, free, shared)
    # Slots each experiment holds, a share at its fraction (exact: whole eighths).
    held = {
        experiment_id: int(eighths) / EIGHTHS_PER_SLOT
        for experiment_id, eighths in session.execute(
            select(Allocation.experiment_id, func.sum(Allocation.eighths))
            .where(Allocation.resource_pool == pool.name)
            .group_by(Allocation.experiment_id)
        )
    }
    submitted = _submit(scheduler, rows)
    _set_shares(session, scheduler, pool, submitted, held)
    placements = scheduler.schedule()
    _claim(session, placements, submitted.experiment_of, now=now, lease_s=lease_s)
    placed_ids = {placement.request_id for placement in placements}
    numbers = _TrialNumbers(session)
    waiting = [
        request
        for trial_id, request in submitted.requests.items()
        if trial_id not in placed_ids and trial_id not in submitted.unschedulable
    ]
    # The head: the blocked one of the pass; with no slot free at all the pass tried
    # nobody, and the first in order is the head.
    blocked = scheduler.blocked_head
    head: SlotRequest | None = (
        submitted.requests[int(str(blocked))]
        if blocked is not None
        else min(waiting, key=lambda request: (request.priority, request.order), default=None)
    )
    preempting = ""
    if pool.preemption and head is not None:
        preempting = _preempt(
            session, pool, scheduler.free_slots(), scheduler.shared_slots(), head, numbers
        )
    _write_reasons(session, pool, scheduler, waiting, head, preempting, numbers, now)
    for trial_id, problem in submitted.unschedulable.items():
        session.execute(
            update(QueuedTrial)
            .where(QueuedTrial.trial_id == trial_id)
            .values(reason=problem, decided_at=now)
        )


def _submit(scheduler: SlotScheduler, rows: Sequence[Any]) -> _Submitted:
    """Submit each row's trial to ``scheduler``; what was submitted (pure, no I/O)."""
    submitted = _Submitted()
    for trial_id, owner, slots, priority, weight, eighths in rows:
        submitted.experiment_of[trial_id] = owner
        submitted.weights.setdefault(owner, weight)
        request = SlotRequest(
            trial_id,
            slots,
            priority=priority,
            order=trial_id,
            group=owner,
            share=slot_share_of(eighths),
        )
        submitted.requests[trial_id] = request
        try:
            scheduler.submit(request)
        except Unschedulable as exc:
            # Another driver's cluster file declares this pool differently.
            submitted.unschedulable[trial_id] = str(exc)
            continue
        submitted.slots_by_experiment[owner] += request.size
    return submitted


def _set_shares(
    session: Session,
    scheduler: SlotScheduler,
    pool: ResourcePool,
    submitted: _Submitted,
    held: Mapping[int, float],
) -> None:
    """Give the scheduler each experiment's fair-share standing: held, weight, served, backlog."""
    queued_slots = {
        experiment_id: int(eighths or 0) / EIGHTHS_PER_SLOT
        for experiment_id, eighths in session.execute(
            select(QueuedTrial.experiment_id, func.sum(QueuedTrial.slots * QueuedTrial.eighths))
            .where(QueuedTrial.resource_pool == pool.name, QueuedTrial.placement.is_(None))
            .group_by(QueuedTrial.experiment_id)
        )
    }
    # Each experiment's latest trial start: among equal shares, the one served least
    # recently goes first (two searches whose trials each take the whole pool alternate).
    served = dict(
        session.execute(
            select(Trial.experiment_id, func.max(TrialRun.started_at))
            .join(TrialRun, TrialRun.trial_id == Trial.id)
            .where(Trial.experiment_id.in_(list(submitted.weights)))
            .group_by(Trial.experiment_id)
        ).all()
    )
    for owner, weight in submitted.weights.items():
        last = served.get(owner)
        scheduler.set_share(
            owner,
            held=held.get(owner, 0.0),
            weight=weight,
            last_served=None if last is None else last.timestamp(),
            backlog=max(0.0, queued_slots.get(owner, 0.0) - submitted.slots_by_experiment[owner]),
        )


def _claim(
    session: Session,
    placements: Sequence[Placement],
    experiment_of: Mapping[int, int],
    *,
    now: _dt.datetime,
    lease_s: float,
) -> None:
    """Claim each placement's slots in the ledger and write it to its queue row."""
    for placement in placements:
        trial_id = placement.request_id
        assert isinstance(trial_id, int)
        token = slot_ledger.claim(
            session,
            placement,
            trial_id=trial_id,
            experiment_id=experiment_of[trial_id],
            lease_s=lease_s,
        )
        if token is None:
            continue  # cannot happen under the queue lock; the next decision retries
        session.execute(
            update(QueuedTrial)
            .where(QueuedTrial.trial_id == trial_id)
            .values(
                placement=warm_jobs.placement_record(placement),
                claim_token=token,
                reason=None,
                decided_at=now,
            )
        )


def _write_reasons(
    session: Session,
    pool: ResourcePool,
    scheduler: SlotScheduler,
    waiting: Sequence[SlotRequest],
    head: SlotRequest | None,
    preempting: str,
    numbers: _TrialNumbers,
    now: _dt.datetime,
) -> None:
    """Each waiting trial's reason: one UPDATE per class, and one for the head.

    Trials of one class (experiment, size, priority) wait for the same reason (the
    scheduler's reasons depend on nothing else), except the blocked head; the rows
    past what the decision read get their class's reason too.
    """
    by_class: dict[_Class, str] = {}
    for request in waiting:
        if head is not None and request.request_id == head.request_id:
            continue
        key = (int(str(request.group)), request.slots, _row_eighths(request), request.priority)
        if key not in by_class:
            by_class[key] = scheduler.why_waiting(
                request.request_id, label=numbers.label, group_label=str
            ).text
    not_head = QueuedTrial.trial_id != int(str(head.request_id)) if head is not None else true()
    for (experiment_id, slots, eighths, priority), reason in by_class.items():
        session.execute(
            update(QueuedTrial)
            .where(
                QueuedTrial.resource_pool == pool.name,
                QueuedTrial.experiment_id == experiment_id,
                QueuedTrial.slots == slots,
                QueuedTrial.eighths == eighths,
                QueuedTrial.priority == priority,
                QueuedTrial.placement.is_(None),
                not_head,
                or_(QueuedTrial.reason.is_(None), QueuedTrial.reason != reason),
            )
            .values(reason=reason, decided_at=now)
            .execution_options(synchronize_session=False)
        )
    if head is not None:
        why = scheduler.why_waiting(head.request_id, label=numbers.label, group_label=str)
        reason = f"{why.text}; {preempting}" if preempting else why.text
        session.execute(
            update(QueuedTrial)
            .where(QueuedTrial.trial_id == int(str(head.request_id)))
            .values(reason=reason, decided_at=now)
        )


def _row_eighths(request: SlotRequest) -> int:
    """A request's ``eighths`` as its queue row holds them: of each of its slots."""
    return request.eighths // request.slots


class _TrialNumbers:
    """Trial labels (``experiment.number``) for the few trials a reason names."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._cache: dict[Hashable, str] = {}

    def label(self, trial_id: Hashable) -> str:
        if trial_id not in self._cache:
            row = self._session.execute(
                select(Trial.experiment_id, Trial.optuna_trial_number).where(
                    Trial.id == int(str(trial_id))
                )
            ).first()
            self._cache[trial_id] = str(trial_id) if row is None else trial_label(*row)
        return self._cache[trial_id]


def _preempt(
    session: Session,
    pool: ResourcePool,
    free: dict[str, frozenset[int]],
    shared: dict[str, dict[int, int]],
    head: SlotRequest,
    numbers: _TrialNumbers,
) -> str:
    """Ask the fewest lower-priority trials that make room for ``head`` to stop.

    Returns what the head waits for now ("preempting trials 3.1, 3.2"), or "" when no
    eligible set of running trials would make room.
    """
    running = _running_requests(session, pool)
    victims = choose_preemptions(
        pool,
        free,
        [r for r, _run in running.values()],
        head,
        without_checkpoint=pool.preempt_without_checkpoint,
        shared=shared,
    )
    if victims is None:
        return ""
    by_head = f"preempted by trial {numbers.label(head.request_id)} "
    stopping = [
        trial_id
        for trial_id, (request, run) in running.items()
        if request.stopping and (run.stop_reason or "").startswith(by_head)
    ]
    reason = by_head + f"(priority {head.priority} over {{priority}})"
    for victim in victims:
        request, run = running[int(str(victim))]
        request_stop(session, run)
        run.stop_reason = reason.format(priority=request.priority)
        stopping.append(int(str(victim)))
    if not stopping:
        return ""
    names = ", ".join(numbers.label(trial_id) for trial_id in sorted(stopping))
    return f"preempting trial{'s' if len(stopping) > 1 else ''} {names} to make room"


def _running_requests(
    session: Session, pool: ResourcePool
) -> dict[int, tuple[RunningRequest, TrialRun]]:
    """The pool's running trials with their priority, placement and newest run."""
    by_trial: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in session.scalars(
        select(Allocation).where(Allocation.resource_pool == pool.name)
    ):
        by_trial[allocation.trial_id].append(allocation)
    if not by_trial:
        return {}
    # Trials a decision placed but whose driver has not started them are not running.
    placed = set(
        session.scalars(
            select(QueuedTrial.trial_id).where(QueuedTrial.trial_id.in_(list(by_trial)))
        )
    )
    runs = {
        run.trial_id: run
        for run in session.scalars(
            select(TrialRun)
            .where(TrialRun.trial_id.in_(list(by_trial)), TrialRun.ended_at.is_(None))
            .order_by(TrialRun.attempt)
        )
    }
    checkpointed = set(
        session.scalars(
            select(Checkpoint.trial_id).where(
                Checkpoint.trial_id.in_(list(by_trial)),
                Checkpoint.state == CheckpointState.COMPLETED,
            )
        )
    )
    rows = session.execute(
        select(Trial.id, Experiment.id, Experiment.config)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .where(Trial.id.in_(list(by_trial)))
    ).all()
    # One parse per experiment, not per trial.
    configs = {experiment_id: config for _, experiment_id, config in rows}
    resources = {experiment_id: _resources_of(config) for experiment_id, config in configs.items()}
    priorities = {
        trial_id: resources[experiment_id].priority for trial_id, experiment_id, _ in rows
    }
    result: dict[int, tuple[RunningRequest, TrialRun]] = {}
    # In the order they started: among equal candidates, the latest started is
    # preempted first (it has done the least work).
    started = sorted(
        (trial_id for trial_id in by_trial if trial_id in runs and trial_id not in placed),
        key=lambda trial_id: (runs[trial_id].started_at, trial_id),
    )
    for trial_id in started:
        run = runs[trial_id]
        allocations = by_trial[trial_id]
        result[trial_id] = (
            RunningRequest(
                request_id=trial_id,
                priority=priorities.get(trial_id, DEFAULT_PRIORITY),
                placement=_placement_of(trial_id, pool, allocations),
                checkpointed=trial_id in checkpointed,
                stopping=run.stop_requested_at is not None,
            ),
            run,
        )
    return result


def _resources_of(stored_config: Any) -> ResourcesConfig:
    """An experiment's resources; the defaults when its stored config does not read.

    One unreadable row must not stop every driver's placement decisions.
    """
    try:
        return read_stored_config(stored_config).resources
    except StoredConfigError:
        return ResourcesConfig()


def _placement_of(
    trial_id: int, pool: ResourcePool, allocations: Sequence[Allocation]
) -> Placement:
    slots: dict[str, list[int]] = defaultdict(list)
    hosts: dict[str, str] = {}
    for allocation in allocations:
        slots[allocation.agent].append(allocation.slot)
        hosts[allocation.agent] = allocation.host
    return Placement(
        trial_id,
        pool.name,
        tuple(
            AgentSlots(_agent(pool, name, hosts[name], ids), tuple(sorted(ids)))
            for name, ids in slots.items()
        ),
        share=slot_share_of(min(allocation.eighths for allocation in allocations)),
    )


def _agent(pool: ResourcePool, name: str, host: str, slots: Sequence[int]) -> Agent:
    try:
        return pool.agent(name)
    except KeyError:
        # Declared by another driver's cluster file only.
        return Agent(name, host, tuple(sorted(slots)))


def _take_placed(
    session: Session, pool: ResourcePool, experiment_id: int
) -> list[tuple[int, ClaimedPlacement]]:
    """The experiment's placed trials whose claims hold; their queue rows are deleted.

    A placed row whose claim no longer holds every one of its slots (released by a
    resume, reclaimed after its lease expired) goes back to waiting for a decision,
    and what is left of its claim is freed: the same slots may be another trial's now.
    """
    rows = list(
        session.scalars(
            select(QueuedTrial)
            .where(
                QueuedTrial.experiment_id == experiment_id,
                QueuedTrial.resource_pool == pool.name,
                QueuedTrial.placement.is_not(None),
            )
            .order_by(QueuedTrial.priority, QueuedTrial.trial_id)
        )
    )
    placed: list[tuple[int, ClaimedPlacement]] = []
    for row in rows:
        assert row.placement is not None
        parts = tuple(
            AgentSlots(
                _agent(pool, part["agent"], part["host"], part["slots"]),
                tuple(part["slots"]),
            )
            for part in row.placement
        )
        placement = ClaimedPlacement(
            row.trial_id,
            pool.name,
            parts,
            share=warm_jobs.share_of_record(row.placement),
            token=row.claim_token,
        )
        if not slot_ledger.holds(session, row.trial_id, placement, row.claim_token):
            slot_ledger.release_claim(session, row.trial_id, row.claim_token)
            slot_ledger.unplace(session, row.trial_id)
            continue
        placed.append((row.trial_id, placement))
        session.delete(row)
    return placed


def queue_view(
    session: Session, *, experiment_id: int | None = None, pool: str | None = None
) -> list[QueuedView]:
    """The queue in the order trials start: by pool, priority, then arrival.

    Within a priority, fair share may start another experiment's trial first; the
    ``reason`` of each waiting trial says so.
    """
    query = (
        select(QueuedTrial, Experiment.name, Trial.optuna_trial_number)
        .join(Experiment, Experiment.id == QueuedTrial.experiment_id)
        .join(Trial, Trial.id == QueuedTrial.trial_id)
        .order_by(QueuedTrial.resource_pool, QueuedTrial.priority, QueuedTrial.trial_id)
    )
    if experiment_id is not None:
        query = query.where(QueuedTrial.experiment_id == experiment_id)
    if pool is not None:
        query = query.where(QueuedTrial.resource_pool == pool)
    return [
        QueuedView(
            pool=row.resource_pool,
            experiment_id=row.experiment_id,
            experiment_name=name,
            trial_id=row.trial_id,
            trial_number=number,
            slots=row.slots,
            priority=row.priority,
            weight=row.weight,
            queued_at=row.queued_at,
            placed_on=tuple(part["agent"] for part in row.placement or ()),
            reason=row.reason,
            share=slot_share_of(row.eighths),
        )
        for row, name, number in session.execute(query)
    ]
