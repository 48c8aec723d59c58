"""How a rank's part of a trial ended, as the runner returns it and the worker prints it."""

from __future__ import annotations

import enum


class TrialOutcome(str, enum.Enum):
    """How :func:`~trials.runtime._runner.run_trial` ended (without an error).

    A ``str`` that prints and compares as its value: the worker's log line shows it.

    Example:
        >>> TrialOutcome.PREEMPTED == "preempted", f"{TrialOutcome.FINISHED}"
        (True, 'finished')
    """

    FINISHED = "finished"  # trained to max_length; rank 0 set the trial's finished_at
    PRUNED = "pruned"  # the study's pruner stopped it; rank 0 set pruned_at
    PREEMPTED = "preempted"  # asked to stop; it checkpointed and set neither

    def __str__(self) -> str:
        return self.value
