"""The search driver's pending queue, and placing it on free slots.

Trials wait here (QUEUED) until the scheduler finds them slots. The queue is the
cluster's, not this driver's: each tick writes this experiment's waiting trials to
the shared queue table and runs one placement decision over every experiment's
waiting trials (:func:`trials.coordination.cluster_queue.decide`, one decision at a time under
the database's lock), which claims the slots of whatever it places in the shared
ledger (:mod:`trials.coordination.allocations`, leased). This driver then starts the trials placed
for its own experiment; a launch that fails for good gives the slots back and fails
the trial, and one whose claim was lost meanwhile (this driver was stopped past its
lease) starts nothing and waits for a new placement.

Example (the driver passes :meth:`RunningTrials.launch <searcher.running.RunningTrials.launch>`,
which starts the trial's processes; this ``launch`` only shows what it is handed):

    >>> from searcher.control import Control, claim_ownership
    >>> from searcher.outcomes import Outcomes
    >>> from searcher.study_side import TellQueue
    >>> claim_ownership(ctx)  # the queue of an experiment without a driver is dropped
    >>> pending = PendingQueue(ctx)
    >>> pending.queue(trial)
    >>> def launch(trial_id, placement):
    ...     print(trial_id, [(part.agent.name, part.slots) for part in placement.agents])
    >>> pending.place(launch, Outcomes(ctx, TellQueue(), Control()))
    1 [('local', (0, 1))]
    >>> len(pending)
    0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searcher.driver_context import DriverContext, driver_log
from searcher.launching import EarlierAttemptRunning
from storage import Trial, is_transient_error, session_scope
from trials.coordination import allocations as slot_ledger
from trials.coordination import cluster_queue
from trials.coordination.allocations import ClaimedPlacement, ClaimLostError
from trials.coordination.attempts import trial_processes_gone

if TYPE_CHECKING:
    from searcher.outcomes import Outcomes


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

    def place(
        self, launch: Callable[[int, ClaimedPlacement | None], None], outcomes: Outcomes
    ) -> None:
        """Start every pending trial that the cluster's placement decision placed.

        The decision (one at a time, over every experiment's queue) claims the slots;
        ``launch(trial_id, placement)`` then starts each trial of this experiment it
        placed. A launch that failed transiently is queued again (the error propagates:
        the tick is retried); any other failure releases the slots and fails the trial.
        """
        if not self._pending:
            return
        ctx = self.ctx
        if ctx.executor.places_trials:
            # The cluster engine (Slurm) places them and keeps its own ledger.
            for pending in sorted(self._pending, key=lambda p: (p.priority, p.order)):
                self._pending.remove(pending)
                self._start(pending, None, launch, outcomes)
            return
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
                        priority=p.priority,
                        weight=resources.weight,
                    )
                    for p in self._pending
                ],
            )
            placed = cluster_queue.decide(
                session,
                ctx.pool,
                experiment_id=ctx.experiment_id,
                lease_s=ctx.timings.lease_s,
                processes_gone=lambda trial_id: trial_processes_gone(session, trial_id),
                unavailable_agents=down,
            )
        for position, (trial_id, placement) in enumerate(placed):
            waiting = next((p for p in self._pending if p.trial_id == trial_id), None)
            if waiting is None:
                # Not waiting here any more (ended while queued): its slots go back.
                with session_scope(ctx.db_url) as session:
                    slot_ledger.release(session, trial_id)
                continue
            self._pending.remove(waiting)
            try:
                self._start(waiting, placement, launch, outcomes)
            except BaseException:
                # The tick is retried: the trials placed after this one wait again,
                # without the slots claimed for them.
                with session_scope(ctx.db_url) as session:
                    for later_id, _ in placed[position + 1 :]:
                        slot_ledger.release(session, later_id)
                raise

    def _start(
        self,
        pending: _Pending,
        placement: ClaimedPlacement | None,
        launch: Callable[[int, ClaimedPlacement | None], None],
        outcomes: Outcomes,
    ) -> None:
        """``launch`` one trial whose slots are claimed (or left to the cluster engine)."""
        ctx = self.ctx
        try:
            launch(pending.trial_id, placement)
        except ClaimLostError as exc:
            # This driver was stopped between the decision and the launch, and the
            # claim was reclaimed (or released by a resume) meanwhile: the slots may be
            # another trial's now. Nothing started; the trial waits for a new placement.
            driver_log.warning("%s; nothing started, the trial waits for a new placement", exc)
            assert placement is not None
            with session_scope(ctx.db_url) as session:
                slot_ledger.release_claim(session, pending.trial_id, placement.token)
            self._pending.append(pending)
        except EarlierAttemptRunning as exc:
            # Not a failure of the trial: it waits, its slots go back meanwhile.
            driver_log.warning("%s", exc)
            with session_scope(ctx.db_url) as session:
                slot_ledger.release(session, pending.trial_id)
            self._pending.append(pending)
        except Exception as exc:
            if is_transient_error(exc):
                # Nothing was started (the run's row comes first); the next tick
                # claims the slots again.
                self._pending.append(pending)
                raise
            with session_scope(ctx.db_url) as session:
                slot_ledger.release(session, pending.trial_id)
                trial = session.get(Trial, pending.trial_id)
                assert trial is not None
                outcomes.launch_failed(trial, exc)
