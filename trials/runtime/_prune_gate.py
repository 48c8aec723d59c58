"""Rank 0 asks the study's pruner only at the validations where its answer can be yes.

Asking (``ChiefRecorder.should_prune``) makes the training loop wait for every write
queued before it (the validation's records, the count of compute spent, the report to
Optuna) and for Optuna's read of the trial: about 10 ms per validation on SQLite, which
for a model whose epoch takes a few hundredths of a second was a third of its training
time. ASHA and Hyperband can only prune at a rung, and the median pruner not before
its warm-up (:meth:`trials.config.PrunerSpec.may_prune`), so everywhere else the answer
is no without asking; the writes then go on behind the next batches.

The step is the one the validation reported: the epoch or batch count, or with rungs in
slot-seconds the compute the trial has spent. Rank 0 learns that count only by waiting
for it, but a run's compute grows by exactly its slots per second of training, so from
the count at the last ask (earlier runs included) the step of any later validation is
known without the database; the first validation of a process always asks.

Example:
    >>> from trials.config import PrunerSpec
    >>> asha = PrunerSpec(name="SuccessiveHalvingPruner",
    ...                   kwargs={"min_resource": 100, "reduction_factor": 3})
    >>> gate = PruneGate(asha, slots=2)
    >>> gate.validated(moment=10.0)  # slot-seconds: the step is counted by rank 0
    >>> gate.must_ask()  # nothing counted yet
    True
    >>> gate.asked(spent=0.4)  # the count at that validation: step 40
    >>> gate.validated(moment=10.2)  # 0.4 s more on 2 slots: step 80 < 100
    >>> gate.must_ask()
    False
    >>> gate.validated(moment=10.35)  # step 110: the first rung passed
    >>> gate.must_ask()
    True
"""

from __future__ import annotations

from trials.config import PrunerSpec, slot_seconds_step


class PruneGate:
    """Whether rank 0 must ask the pruner at the latest validation."""

    def __init__(self, pruner: PrunerSpec | None, slots: float) -> None:
        self.pruner = pruner
        self.slots = slots
        # The step Optuna saw at the last ask (None: not asked in this process).
        self._asked_at: int | None = None
        # The latest validation: its step (None with slot-seconds), its moment.
        self._step: int | None = None
        self._moment = 0.0
        # Slot-seconds counted at the last ask, and that validation's moment.
        self._counted: tuple[float, float] | None = None

    def validated(self, *, moment: float, step: int | None = None) -> None:
        """A validation was reported at ``step`` (None: in slot-seconds, counted at ``moment``)."""
        self._step = step
        self._moment = moment

    def must_ask(self) -> bool:
        """Whether the pruner could answer yes at the latest validation."""
        if self.pruner is None:
            return True
        step = self._step
        if step is None:
            if self._counted is None:
                return True
            spent, at = self._counted
            # One step more: the count's own rounding must never hide a rung.
            step = slot_seconds_step(spent + self.slots * max(0.0, self._moment - at)) + 1
        return self.pruner.may_prune(self._asked_at, step)

    def asked(self, *, spent: float | None = None) -> None:
        """The pruner was asked at the latest validation (``spent``: its slot-seconds count)."""
        if spent is None:
            self._asked_at = self._step
            return
        self._counted = (spent, self._moment)
        self._asked_at = slot_seconds_step(spent)
