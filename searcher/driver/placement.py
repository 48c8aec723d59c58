"""The search driver's pending queue, and placing it on free slots.

Trials wait here (QUEUED) until the scheduler finds them slots. The queue is the
cluster's, not this driver's: each tick writes this experiment's waiting trials to
the shared queue table and runs one placement decision over every experiment's
waiting trials (:func:`trials.coordination.cluster_queue.decide`, one decision at a time under
the database's lock), which claims the slots of whatever it places in the shared
ledger (:mod:`trials.coordination.allocations`, leased). :meth:`PendingQueue.place` takes the
trials placed for this experiment off the queue and returns their placements, in the
decision's order; the launching step (:meth:`searcher.driver.running.RunningTrials.launch`)
starts them, and a trial that could not start comes back here as a
:class:`~searcher.driver.decisions.Requeue`.

Example (the driver hands the placements to
:meth:`RunningTrials.launch <searcher.driver.running.RunningTrials.launch>`, which starts the
trials' processes):

    >>> from searcher.driver.control import claim_ownership
    >>> claim_ownership(ctx)  # the queue of an experiment without a driver is dropped
    >>> pending = PendingQueue(ctx)
    >>> pending.queue(trial)
    >>> for placed in pending.place():
    ...     agents = placed.placement.agents if placed.placement else ()
    ...     print(placed.trial_id, [(part.agent.name, part.slots) for part in agents])
    1 [('local', (0, 1))]
    >>> len(pending)
    0
"""

from __future__ import annotations

from dataclasses import dataclass

from searcher.driver.context import DriverContext
from storage import Trial, session_scope
from trials.config import slot_eighths
from trials.coordination import allocations as slot_ledger
from trials.coordination import cluster_queue
from trials.coordination.allocations import ClaimedPlacement
from trials.coordination.attempts import trial_processes_gone


@dataclass(frozen=True)
class Placed:
    """A trial the placement decision placed, taken off the pending queue to be launched."""

    trial_id: int
    #: The trial's ``slots_per_trial`` (it is queued again with them if it cannot start).
    slots: int
    #: Its claimed slots; None where the executor's cluster engine places trials.
    placement: ClaimedPlacement | None


@dataclass
class _Pending:
    trial_id: int
    slots: int
    order: int
    priority: int


class PendingQueue:
    """The trials waiting for slots, oldest first, and the step that places them."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        self._pending: list[_Pending] = []

    def __len__(self) -> int:
        return len(self._pending)

    def sizes(self) -> set[int]:
        """The ``slots_per_trial`` of the waiting trials."""
        return {pending.slots for pending in self._pending}

    def first_of_size(self, slots: int) -> int | None:
        """The waiting trial of ``slots`` slots that the queue would offer first, if any."""
        sized = [p for p in self._pending if p.slots == slots]
        return min(sized, key=lambda p: (p.priority, p.order)).trial_id if sized else None

    def remove(self, trial_id: int) -> None:
        """Take the trial off the queue (decided ahead for a warm job: ``searcher.driver.handoff``)."""
        self._pending = [p for p in self._pending if p.trial_id != trial_id]

    def queue(self, trial: Trial) -> None:
        """Add ``trial`` to the queue (once: a retried tick may queue it again)."""
        self.requeue(trial.id, trial.slots_per_trial)

    def requeue(self, trial_id: int, slots: int) -> None:
        """Add the trial of ``slots`` slots to the queue (once, as :meth:`queue`)."""
        if any(p.trial_id == trial_id for p in self._pending):
            return  # queued by a tick whose transaction was retried
        self._pending.append(
            _Pending(
                trial_id=trial_id,
                slots=slots,
                order=trial_id,
                priority=self.ctx.config.resources.priority,
            )
        )

    def place(self, room: int | None = None) -> list[Placed]:
        """Take off the queue every pending trial that the cluster's placement decision placed.

        The decision (one at a time, over every experiment's queue) claims the slots;
        the placements come back in the decision's order, for the launching step
        (:meth:`searcher.driver.running.RunningTrials.launch`) to start. A trial the decision
        placed that no longer waits here (it ended while queued) gets its slots back.

        ``room`` (None: no limit) is how many more trials may run now: only the oldest
        ``room`` pending trials are offered to the cluster, and no more are placed. The
        others were asked ahead (:meth:`searcher.driver.study_side.StudySide.fill_queue`) and
        wait here, out of the cluster's queue, until a running trial ends.
        """
        if not self._pending or room == 0:
            return []
        ctx = self.ctx
        offered = sorted(self._pending, key=lambda p: (p.priority, p.order))
        if room is not None:
            offered = offered[:room]
        if ctx.executor.places_trials:
            # The cluster engine (Slurm) places them and keeps its own ledger.
            engine_places = [Placed(p.trial_id, p.slots, None) for p in offered]
            taken = {p.trial_id for p in offered}
            self._pending = [p for p in self._pending if p.trial_id not in taken]
            return engine_places
        resources = ctx.config.resources
        # A lost or drained node takes no trial until its executor has it back.
        down = ctx.executor.unavailable_agents([agent.name for agent in ctx.pool.agents])
        with session_scope(ctx.db_url) as session:
            cluster_queue.enqueue(
                session,
                [
                    cluster_queue.QueueEntry(
                        trial_id=p.trial_id,
                        experiment_id=ctx.experiment_id,
                        pool=ctx.pool.name,
                        slots=p.slots,
                        eighths=slot_eighths(resources.slot_share),
                        priority=p.priority,
                        weight=resources.weight,
                    )
                    for p in offered
                ],
            )
            decided = cluster_queue.decide(
                session,
                ctx.pool,
                experiment_id=ctx.experiment_id,
                lease_s=ctx.timings.lease_s,
                processes_gone=lambda trial_id: trial_processes_gone(session, trial_id),
                unavailable_agents=down,
            )
        waiting = {p.trial_id: p for p in self._pending}
        placed: list[Placed] = []
        for trial_id, placement in decided:
            pending = waiting.get(trial_id)
            if pending is None or (room is not None and len(placed) >= room):
                # Not waiting here any more (ended while queued), or past the room (a
                # trial queued by an earlier tick): its slots go back, and one still
                # waiting here is placed again later.
                with session_scope(ctx.db_url) as session:
                    slot_ledger.release(session, trial_id)
                continue
            del waiting[trial_id]
            placed.append(Placed(trial_id, pending.slots, placement))
        # Taken off only now: a database error above leaves every trial waiting here.
        self._pending = [p for p in self._pending if p.trial_id in waiting]
        return placed
