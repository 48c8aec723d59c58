"""The driver's terminal output: a live progress bar and the table of best trials."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from searcher.experiments import TrialCounts
    from storage import Trial


class SearchProgress:
    """trials done/running/pruned/failed of max_trials, and the best value so far."""

    def __init__(self, total: int, *, metric: str, enabled: bool = True) -> None:
        self.total = total
        self.metric = metric
        self._last: tuple[object, ...] | None = None
        self._progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
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
        best_text = "-" if best is None else f"{best:.6g}"
        self._progress.update(
            self._task,
            completed=counts.finished,
            total=max(self.total, counts.total),
            description=(
                f"running {counts.running}  completed {counts.completed}  "
                f"pruned {counts.pruned}  failed {counts.errored}  "
                f"best {self.metric} {best_text}"
            ),
        )


def best_trials_table(trials: list[Trial], metric: str, title: str = "Best trials") -> Table:
    """A rich table of trials with their hyperparameters and searcher metric."""
    table = Table(title=title)
    table.add_column("trial", justify="right")
    table.add_column(metric, justify="right")
    table.add_column("slots", justify="right")
    table.add_column("hyperparameters")
    for trial in trials:
        value = trial.searcher_metric_value
        table.add_row(
            str(trial.id),
            "-" if value is None else f"{value:.6g}",
            str(trial.slots_per_trial),
            ", ".join(f"{k}={_short(v)}" for k, v in sorted(trial.hparams.items())),
        )
    return table


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
