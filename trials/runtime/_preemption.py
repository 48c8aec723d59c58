"""Whether a trial is asked to checkpoint and stop: rank 0 asks, the other ranks follow.

Two sources ask: the driver (pausing the experiment, preempting the trial for another),
whose request rank 0's recorder reads with every commit, and the cluster engine, whose
SIGTERM :mod:`trials.runtime._signals` notes. Rank 0 looks at both at every training
report and shares its answer in that report's collective, so every rank stops at the
same step, as with Determined's ``PreemptMode.WorkersAskChief``. The other ranks hold
:data:`NO_PREEMPTION`: they never ask on their own.
"""

from __future__ import annotations

from typing import Protocol

from trials.runtime._recording import Recorder
from trials.runtime._signals import stop_asked


class Preemption(Protocol):
    """Whether this rank asks the trial to checkpoint and stop at this report."""

    def requested(self) -> bool:
        """Whether to stop now; called once per training report."""
        ...


class ChiefPreemption:
    """Rank 0's view: a SIGTERM from the cluster or the driver's request, via its recorder.

    A SIGTERM is recorded as the cluster's request (the run's ``stop_requested_at``), so
    the driver resumes the trial from the checkpoint instead of failing it.
    """

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def requested(self) -> bool:
        if stop_asked():
            self._recorder.stop_asked_by_cluster()
        return self._recorder.stop_requested


class NoPreemption:
    """A rank that never asks to stop: it learns rank 0's answer from the report.

    Example:
        >>> NO_PREEMPTION.requested()
        False
    """

    def requested(self) -> bool:
        return False


NO_PREEMPTION = NoPreemption()
