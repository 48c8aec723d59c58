"""Rank 0's writes to the database and its questions to Optuna, off the training thread.

Only rank 0 constructs a :class:`ChiefRecorder`, and only it imports SQLAlchemy,
``storage`` and Optuna (inside the recorder's thread, while the main thread builds
the model), so the other ranks start without them. Writes are queued and applied in
order by one thread (:mod:`trials.runtime._recorder_queue`): a training step never
waits for SQLite. Whatever must be durable
before training goes on (a checkpoint's row, the final state of the trial) or whose
answer the loop needs (should this trial be pruned?) is a synchronous :meth:`call`,
which also waits for every write queued before it.

Every transaction is fenced (``storage.claim_attempt``): it commits only while this
rank's attempt is still the trial's current one, and stamps the run's progress for the
driver's hang detection. A superseded attempt writes nothing more and its rank stops
(:class:`TrialStopped`). A database that is briefly unreachable (a PostgreSQL restart,
SQLite locked by another writer) is waited out: each transaction is re-run whole
(``storage.retry_transient``), so every write here is idempotent.
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.config import RuntimeSpec, slot_seconds_step
from trials.retention import collect_garbage
from trials.runtime._recorder_queue import RecorderQueue
from trials.runtime._spent import slot_seconds_so_far
from trials.runtime._study_reports import StudyReports
from trials.runtime._timing import TimingWindow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class RankProcess:
    """One rank's process as rank 0 records it (``storage.TrialProcess``, role RANK)."""

    rank: int
    local_rank: int
    host: str
    agent: str
    pid: int
    create_time: float
    slots: tuple[int, ...]


class ChiefRecorder(RecorderQueue):
    """The database side of rank 0: metrics, timings, checkpoints, trial fields, pruning.

    Example:
        >>> recorder = ChiefRecorder(spec)
        >>> recorder.training_metrics(step=100, epoch=1.0, values={"loss": 0.4})
        >>> recorder.close()
    """

    def __init__(self, spec: RuntimeSpec) -> None:
        super().__init__(spec)
        self._study = StudyReports(spec)
        self._compute_spent = 0.0

    # -- what the runtime records ----------------------------------------------------

    def training_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged training metrics at ``step`` (batches trained), and the progress."""
        values = dict(values)

        def write(session: Session) -> None:
            from storage import MetricKind, record_metrics

            record_metrics(session, self.spec.trial_id, step, MetricKind.TRAINING, values, epoch)
            self._update_trial(session, total_batches=step)

        self.submit_write(write)

    def validation_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged validation metrics; the searcher metric also goes on the trial row."""
        values = dict(values)
        metric = values.get(self.spec.searcher_metric)

        def write(session: Session) -> None:
            from storage import MetricKind, record_metrics

            record_metrics(session, self.spec.trial_id, step, MetricKind.VALIDATION, values, epoch)
            fields: dict[str, Any] = {"total_batches": step}
            if metric is not None:
                # A NaN (diverged) value clears the last finite one: the driver then
                # reports the divergence rather than rank an earlier, better value.
                value = float(metric)
                fields["searcher_metric_value"] = None if math.isnan(value) else value
            self._update_trial(session, **fields)

        self.submit_write(write)

    def stop_asked_by_cluster(self) -> None:
        """Stop at this report, and record that the cluster asked (a SIGTERM from Slurm).

        The run's ``stop_requested_at`` tells the driver that the attempt stopped on
        request, so it resumes the trial from the checkpoint instead of failing it.
        """
        if self.stop_requested:
            return
        self.stop_requested = True

        def write(session: Session) -> None:
            from sqlalchemy import update

            from storage import TrialRun, utcnow

            if self._run_id is not None:
                session.execute(
                    update(TrialRun)
                    .where(TrialRun.id == self._run_id, TrialRun.stop_requested_at.is_(None))
                    .values(stop_requested_at=utcnow())
                )

        self.submit_write(write)

    def rewind(self, step: int) -> None:
        """Forget what an earlier attempt recorded past ``step`` (the restored checkpoint).

        That attempt's later metrics and timings belong to a timeline that was abandoned;
        the restored run records its own (metrics by upsert, timings as new windows).
        """

        def write(session: Session) -> None:
            from sqlalchemy import delete

            from storage import Metric, Timing

            trial_id = self.spec.trial_id
            session.execute(delete(Metric).where(Metric.trial_id == trial_id, Metric.step > step))
            session.execute(
                delete(Timing).where(Timing.trial_id == trial_id, Timing.end_step > step)
            )
            self._update_trial(session, total_batches=step)

        self.submit_write(write)

    def timings(self, windows: Sequence[TimingWindow]) -> None:
        """Profiling windows; a window re-run after a lost commit replaces itself."""
        if not windows:
            return
        rows = list(windows)

        def write(session: Session) -> None:
            from sqlalchemy import delete, tuple_

            from storage import Timing

            trial_id = self.spec.trial_id
            session.execute(
                delete(Timing).where(
                    Timing.trial_id == trial_id,
                    tuple_(Timing.name, Timing.start_step, Timing.end_step).in_(
                        [(w.name, w.start_step, w.end_step) for w in rows]
                    ),
                )
            )
            session.add_all(Timing(**row) for row in timing_rows(trial_id, rows))

        self.submit_write(write)

    def fusion_choice(self, shape_key: str, world_size: int) -> float | None:
        """The bucket size (MB) an earlier trial of this experiment chose for the shape."""
        from storage import fusion_choice

        experiment_id = self.spec.experiment_id
        return self.call_write(
            lambda session: fusion_choice(session, experiment_id, shape_key, world_size)
        )

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
        """The chosen size for later trials (the first recorded stays); the probes' step
        times as this trial's timings."""
        self.timings(windows)

        def write(session: Session) -> None:
            from storage import FusionChoice, keep_first_fusion_choice

            keep_first_fusion_choice(
                session,
                FusionChoice(
                    experiment_id=self.spec.experiment_id,
                    shape_key=shape_key,
                    world_size=world_size,
                    bucket_mb=bucket_mb,
                    parameters=parameters,
                    gradient_bytes=gradient_bytes,
                    trial_id=self.spec.trial_id,
                ),
            )

        self.submit_write(write)

    def register(self, processes: Sequence[RankProcess]) -> None:
        """Record every rank's process under this attempt's run (and its first progress).

        A later driver finds leftover ranks by these rows (pid plus start time), so a
        restart never runs beside an orphan of this attempt.
        """
        ranks = list(processes)

        def write(session: Session) -> None:
            from sqlalchemy import select

            from storage import ProcessRole, TrialProcess

            if self._run_id is None:
                print(
                    f"slotsweep: trial {self.spec.trial_id} has no run for attempt "
                    f"{self.spec.attempt}; its rank processes are not recorded",
                    file=sys.stderr,
                    flush=True,
                )
                return
            known = set(
                session.scalars(
                    select(TrialProcess.rank).where(
                        TrialProcess.run_id == self._run_id,
                        TrialProcess.role == ProcessRole.RANK,
                    )
                )
            )
            session.add_all(
                TrialProcess(
                    run_id=self._run_id,
                    trial_id=self.spec.trial_id,
                    attempt=self.spec.attempt,
                    role=ProcessRole.RANK,
                    agent=p.agent,
                    host=p.host,
                    slots=list(p.slots),
                    rank=p.rank,
                    local_rank=p.local_rank,
                    pid=p.pid,
                    create_time=p.create_time,
                )
                for p in ranks
                if p.rank not in known
            )

        self.submit_write(write)

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
        """Record a written checkpoint, then collect garbage; returns the deleted uuids.

        Synchronous: when it returns, a restart can find this checkpoint.
        """
        metrics = dict(metrics)

        def write(session: Session) -> None:
            from sqlalchemy import select

            from storage import Checkpoint

            if session.scalar(select(Checkpoint.id).where(Checkpoint.uuid == uuid)) is not None:
                return  # committed by a try whose acknowledgement was lost
            session.add(
                Checkpoint(
                    **checkpoint_row(
                        trial_id=self.spec.trial_id,
                        uuid=uuid,
                        step=step,
                        epoch=epoch,
                        path=path,
                        size_bytes=size_bytes,
                        metrics=metrics,
                    )
                )
            )

        def garbage(session: Session) -> list[str]:
            return collect_garbage(
                session,
                experiment_id=self.spec.experiment_id,
                policy=self.spec.checkpoint_storage,
                metric=self.spec.searcher_metric,
                smaller_is_better=self.spec.smaller_is_better,
                trial_id=self.spec.trial_id,
                known_intact={uuid},  # written whole just now: not read back
            )

        def record() -> list[str]:
            self._transaction(write)
            # Its own transaction: the checkpoint stays recorded if collecting garbage fails.
            return self._transaction(garbage)

        return self.call(record)

    def report_intermediate(self, value: float, step: int, moment: float) -> None:
        """Report the searcher metric at ``step`` to the Optuna trial (for its pruner and plots).

        ``moment`` (a ``time.time()``) is the validation's. With cost objectives the
        report waits for the pruner's next question (:class:`StudyReports`).
        """
        if self.spec.objectives:
            self.submit(lambda: self._study.report(value, step, moment))
            return

        def report() -> None:
            # Optuna's write is its own transaction; the fence (and progress) of this one
            # just before it keeps a superseded attempt from reporting.
            self._transaction(lambda session: None)
            self._study.report(value, step, moment)

        self.submit(report)

    def training_started(self) -> None:
        """The run's start-up is done and its first batch begins: stamp the run's row.

        The stamp is the moment of this call; the compute a trial spent (rungs in
        slot-seconds) counts each run from it (:mod:`trials.compute_spent`).
        """
        moment = time.time()

        def write(session: Session) -> None:
            from sqlalchemy import update

            from storage import TrialRun, utc_from_timestamp

            if self._run_id is not None:
                session.execute(
                    update(TrialRun)
                    .where(TrialRun.id == self._run_id, TrialRun.training_started_at.is_(None))
                    .values(training_started_at=utc_from_timestamp(moment))
                )

        self.submit_write(write)

    def report_compute(self, value: float | None, moment: float) -> None:
        """Count the trial's compute at ``moment``; report ``value`` to Optuna at it.

        ``moment`` (a ``time.time()``) is the validation's. The count is the trial's
        runs' training spans up to it, read from the database (so a restarted run
        carries on from its trial's earlier runs);
        :meth:`compute_spent` returns it. ``value`` None counts without reporting
        (pruning off, a ``max_length`` in slot-seconds).
        """

        def report() -> None:
            spent = self._transaction(
                lambda session: slot_seconds_so_far(session, self.spec, moment)
            )
            self._compute_spent = spent
            if value is not None:
                self._study.report(value, slot_seconds_step(spent), moment, spent)

        self.submit(report)

    def compute_spent(self) -> float:
        """Slot-seconds counted by the latest :meth:`report_compute` (waits for it)."""
        return self.call(lambda: self._compute_spent)

    def should_prune(self) -> bool:
        """Ask the study's pruner about the values reported so far."""
        return self.call(lambda: self._study.ask(self._transaction))

    def finished(self, total_batches: int) -> None:
        """The user's training ran to its end: the driver will mark the trial COMPLETED.

        Queued: the runner's next :meth:`flush` or :meth:`call_write` commits it."""

        def write(session: Session) -> None:
            from storage import utcnow

            self._update_trial(session, total_batches=total_batches, finished_at=utcnow())

        self.submit_write(write)

    def pruned(self, total_batches: int) -> None:
        """The pruner stopped the trial: the driver will mark it PRUNED."""

        def write(session: Session) -> None:
            from storage import utcnow

            self._update_trial(session, total_batches=total_batches, pruned_at=utcnow())

        self.call_write(write)


# -- row shapes, shared with bulk writers (the UI's test and benchmark data) ------------


def timing_rows(
    trial_id: int, windows: Iterable[TimingWindow], *, recorded_at: _dt.datetime | None = None
) -> list[dict[str, Any]]:
    """The ``storage.Timing`` rows of profiling windows, as :meth:`ChiefRecorder.timings` writes.

    Without ``recorded_at`` a row takes the column's default (the time of its insert).

    Example:
        >>> timing_rows(7, [TimingWindow("train_batch", 0, 2, 2, 0.5, 0.5, 0.6, 1.0)])[0]["count"]
        2
    """
    rows = [
        {
            "trial_id": trial_id,
            "name": w.name,
            "start_step": w.start_step,
            "end_step": w.end_step,
            "count": w.count,
            "mean_s": w.mean_s,
            "p50_s": w.p50_s,
            "p95_s": w.p95_s,
            "total_s": w.total_s,
        }
        for w in windows
    ]
    if recorded_at is not None:
        for row in rows:
            row["recorded_at"] = recorded_at
    return rows


def checkpoint_row(
    *,
    trial_id: int,
    uuid: str,
    step: int,
    epoch: float | None,
    path: str | Path,
    size_bytes: int,
    metrics: Mapping[str, float],
    created_at: _dt.datetime | None = None,
) -> dict[str, Any]:
    """The ``storage.Checkpoint`` row of a written checkpoint (:meth:`ChiefRecorder.checkpoint`).

    JSON has no NaN or infinity (PostgreSQL refuses them): such a metric is stored as
    null, which retention ranks as "no value". Without ``created_at`` the row takes the
    column's default (the time of its insert).
    """
    from storage import CheckpointState

    row: dict[str, Any] = {
        "uuid": uuid,
        "trial_id": trial_id,
        "step": step,
        "epoch": epoch,
        "path": str(path),
        "size_bytes": size_bytes,
        "metrics": {name: float(v) if math.isfinite(v) else None for name, v in metrics.items()},
        "state": CheckpointState.COMPLETED,
    }
    if created_at is not None:
        row["created_at"] = created_at
    return row
