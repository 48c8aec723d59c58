"""A trial's compute so far, in slot-seconds, from what its runs recorded in the database.

Pruning rungs in slot-seconds (``searcher.pruner.resource: slot_seconds``) compare
trials at equal compute: slots times training time since the trial started, each run's
start-up excluded and every run counted (a restart's repeated batches cost compute
too). The count is derived from the runs' rows alone, never from a process's clock, so
a run restarted from a checkpoint (or a search resumed, or continued) carries on from
the compute its trial had spent and does not meet rungs it already passed.

Each run counts from ``training_started_at`` (rank 0's stamp before its first batch)
to the earliest of its end, its last progress (the last record rank 0 committed: a run
that died counts up to its last sign of training, not to the moment a driver noticed)
and the moment asked about. A run that never began training counts nothing.

Example:
    >>> import datetime as dt
    >>> t0 = dt.datetime(2026, 1, 1)
    >>> first = RunSpan(t0, last_progress_at=t0 + dt.timedelta(seconds=30),
    ...                 ended_at=t0 + dt.timedelta(seconds=45))
    >>> second = RunSpan(t0 + dt.timedelta(seconds=60))
    >>> slot_seconds_spent([first, second], slots=2, moment=t0 + dt.timedelta(seconds=70))
    80.0
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunSpan:
    """The moments of one run that bound its training, as its row records them."""

    #: When rank 0 began the run's first batch (None: it never did).
    training_started_at: dt.datetime | None
    #: The run's last committed record (``TrialRun.progress_at``).
    last_progress_at: dt.datetime | None = None
    #: When the driver saw the run end (None: running, or never seen to end).
    ended_at: dt.datetime | None = None

    def seconds(self, moment: dt.datetime) -> float:
        """Training seconds of this run up to ``moment`` (0 before its training began).

        Example:
            >>> t0 = dt.datetime(2026, 1, 1)
            >>> RunSpan(t0, ended_at=t0 + dt.timedelta(seconds=5)).seconds(
            ...     t0 + dt.timedelta(seconds=9))
            5.0
        """
        if self.training_started_at is None:
            return 0.0
        until = min(m for m in (self.ended_at, self.last_progress_at, moment) if m is not None)
        return max(0.0, (until - self.training_started_at).total_seconds())


def slot_seconds_spent(runs: Iterable[RunSpan], slots: float, moment: dt.datetime) -> float:
    """The trial's compute up to ``moment``: ``slots`` times its runs' training seconds.

    A trial on a share of one slot counts at its share (``slots`` 0.25 for a quarter).

    ``moment`` is when the validation being reported was recorded; runs that end later
    count only up to it.
    """
    return slots * sum(run.seconds(moment) for run in runs)
