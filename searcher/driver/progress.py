"""The driver's live progress bar: trials finished of max_trials, and the best value so far.

At 80 columns it stays readable: the count and the elapsed time come right after a
short bar and never shrink, and the per-state counts fold onto a second line instead
of being cut to "…".
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from trials.numbers import format_value

if TYPE_CHECKING:
    from trials.queries import TrialCounts

# Short enough that the bar, the count and the time leave room for the states at 80 columns.
_BAR_WIDTH = 20


class SearchProgress:
    """trials done/running/pruned/failed of max_trials, and the best value so far."""

    def __init__(
        self,
        total: int,
        *,
        metric: str,
        enabled: bool = True,
        console: Console | None = None,
    ) -> None:
        self.total = total
        self.metric = metric
        self.enabled = enabled
        self._last: tuple[object, ...] | None = None
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            TextColumn("[bold]trials", table_column=fixed),
            BarColumn(bar_width=_BAR_WIDTH, table_column=Column(no_wrap=True)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.description}", table_column=Column(ratio=1, overflow="fold")),
            console=console or Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("", total=total)

    def __enter__(self) -> SearchProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, counts: TrialCounts, best: float | None) -> None:
        state = (counts, best)
        if state == self._last:
            return
        self._last = state
        self._progress.update(
            self._task,
            completed=counts.finished,
            total=max(self.total, counts.total),
            description=(
                f"running {counts.running}, completed {counts.completed}, "
                f"pruned {counts.pruned}, failed {counts.errored}; "
                f"best {self.metric} {format_value(best)}"
            ),
        )
