"""What a rank records, as a protocol, and the stand-in of the ranks that record nothing.

Only rank 0 writes to the database (:class:`~trials.runtime._recorder.ChiefRecorder`);
every other rank, and a context built without a database (a unit test), holds
:data:`NO_RECORDER`. The runtime calls the same methods on either, as Determined's
core context does with its ``DummyTrainContext``: which rank records is decided once,
where the rank's recorder is built, and nowhere else.

The stand-in imports nothing and does nothing: the ranks that hold it start without
SQLAlchemy or Optuna, and its calls cost a method call each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from trials.runtime._timing import TimingWindow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from trials.runtime._recorder import RankProcess

T = TypeVar("T")


class Recorder(Protocol):
    """The database side of a rank: metrics, timings, checkpoints, pruning, the end.

    The methods that queue a write return at once; those whose result the loop needs
    (a checkpoint's row, the pruner's answer) wait for it, and the trial's end is
    committed by the :meth:`flush` or :meth:`call_write` that follows it.
    """

    @property
    def stop_requested(self) -> bool:
        """Whether the driver (or the cluster, via :meth:`stop_asked_by_cluster`) asked
        the trial to checkpoint and stop, as of the last commit."""
        ...

    def register(self, processes: Sequence[RankProcess]) -> None:
        """Record the trial's rank processes under this attempt's run."""
        ...

    def training_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged training metrics at ``step`` (batches trained)."""
        ...

    def validation_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged validation metrics at ``step``."""
        ...

    def report_intermediate(self, value: float, step: int, moment: float) -> None:
        """The searcher metric at ``step`` (validated at ``moment``), for the study's pruner."""
        ...

    def training_started(self) -> None:
        """The run's start-up is done: its first batch begins now."""
        ...

    def report_compute(self, value: float | None, moment: float) -> None:
        """Count the trial's compute (slot-seconds) at ``moment``; report ``value`` to Optuna at it."""
        ...

    def compute_spent(self) -> float:
        """Slot-seconds counted by the latest :meth:`report_compute`."""
        ...

    def should_prune(self) -> bool:
        """Whether the study's pruner stops this trial."""
        ...

    def pruned(self, total_batches: int) -> None:
        """The pruner stopped the trial."""
        ...

    def finished(self, total_batches: int) -> None:
        """The user's training ran to its end."""
        ...

    def rewind(self, step: int) -> None:
        """Forget what an earlier attempt recorded past ``step``."""
        ...

    def timings(self, windows: Sequence[TimingWindow]) -> None:
        """Profiling windows of the loop's phases."""
        ...

    def fusion_choice(self, shape_key: str, world_size: int) -> float | None:
        """The bucket size (MB) this search already chose for a model shape and world size."""
        ...

    def record_fusion_choice(
        self,
        shape_key: str,
        world_size: int,
        bucket_mb: float,
        windows: Sequence[TimingWindow],
        *,
        parameters: int,
        gradient_bytes: int,
    ) -> None:
        """The chosen bucket size, and the step times of every size tried (as timings)."""
        ...

    def checkpoint(
        self,
        *,
        uuid: str,
        step: int,
        epoch: float | None,
        path: Path | str,
        size_bytes: int,
        metrics: Mapping[str, float],
    ) -> list[str]:
        """Record a written checkpoint and collect garbage; the deleted uuids."""
        ...

    def stop_asked_by_cluster(self) -> None:
        """Stop at this report: the cluster asked (a SIGTERM from Slurm)."""
        ...

    def flush(self) -> None:
        """Wait until every queued write is committed."""
        ...

    def call_write(self, body: Callable[[Session], T]) -> T | None:
        """Run ``body`` in a fenced transaction after every queued write; its result."""
        ...

    def close(self, timeout: float = 60.0) -> None:
        """Commit what is queued and stop recording."""
        ...


class NoRecorder:
    """The recorder of a rank that records nothing (every rank but 0, or no database).

    Its pruner never prunes and nobody asks it to stop: rank 0 decides both, and the
    other ranks learn the decision from rank 0's collectives.

    Example:
        >>> NO_RECORDER.should_prune(), NO_RECORDER.stop_requested
        (False, False)
    """

    @property
    def stop_requested(self) -> bool:
        return False

    def register(self, processes: Sequence[RankProcess]) -> None:
        """Nothing: rank 0 registers every rank's process."""

    def training_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Nothing: rank 0 records the averaged metrics."""

    def validation_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Nothing: rank 0 records the averaged metrics."""

    def report_intermediate(self, value: float, step: int, moment: float) -> None:
        """Nothing: rank 0 reports to the study."""

    def training_started(self) -> None:
        """Nothing: rank 0 stamps the run."""

    def report_compute(self, value: float | None, moment: float) -> None:
        """Nothing: rank 0 counts the compute and reports to the study."""

    def compute_spent(self) -> float:
        """Nothing counted here: rank 0's count decides, through its collectives."""
        return 0.0

    def should_prune(self) -> bool:
        return False

    def pruned(self, total_batches: int) -> None:
        """Nothing: rank 0 records the end."""

    def finished(self, total_batches: int) -> None:
        """Nothing: rank 0 records the end."""

    def rewind(self, step: int) -> None:
        """Nothing: rank 0 forgets the abandoned timeline."""

    def timings(self, windows: Sequence[TimingWindow]) -> None:
        """Nothing: only rank 0 profiles."""

    def fusion_choice(self, shape_key: str, world_size: int) -> float | None:
        """None: rank 0 looks the choice up and broadcasts it."""
        return None

    def record_fusion_choice(
        self,
        shape_key: str,
        world_size: int,
        bucket_mb: float,
        windows: Sequence[TimingWindow],
        *,
        parameters: int,
        gradient_bytes: int,
    ) -> None:
        """Nothing: rank 0 records the choice."""

    def checkpoint(
        self,
        *,
        uuid: str,
        step: int,
        epoch: float | None,
        path: Path | str,
        size_bytes: int,
        metrics: Mapping[str, float],
    ) -> list[str]:
        """Nothing recorded, nothing collected."""
        return []

    def stop_asked_by_cluster(self) -> None:
        """Nothing: without a database there is no driver to tell."""

    def flush(self) -> None:
        """Nothing is queued."""

    def call_write(self, body: Callable[[Session], T]) -> T | None:
        """None: nothing is written here (rank 0 writes)."""
        return None

    def close(self, timeout: float = 60.0) -> None:
        """Nothing to stop."""


# Stateless, so one serves every rank and every context.
NO_RECORDER = NoRecorder()
