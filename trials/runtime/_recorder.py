"""Rank 0's writes to the database and its questions to Optuna, off the training thread.

Only rank 0 constructs a :class:`ChiefRecorder`, and only it imports SQLAlchemy,
``storage`` and Optuna (inside the recorder's thread, while the main thread builds
the model), so the other ranks start without them. Writes are queued and applied in
order by one thread: a training step never waits for SQLite. Whatever must be durable
before training goes on (a checkpoint's row, the final state of the trial) or whose
answer the loop needs (should this trial be pruned?) is a synchronous :meth:`call`,
which also waits for every write queued before it.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trials._config import RuntimeSpec
from trials.retention import collect_garbage
from trials.runtime._timing import TimingWindow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

T = TypeVar("T")


class ChiefRecorder:
    """The database side of rank 0: metrics, timings, checkpoints, trial fields, pruning.

    Example:
        >>> recorder = ChiefRecorder(spec)  # doctest: +SKIP
        >>> recorder.training_metrics(step=100, epoch=1.0, values={"loss": 0.4})  # doctest: +SKIP
        >>> recorder.close()  # doctest: +SKIP
    """

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._tasks: queue.Queue[tuple[Callable[[], Any], Future[Any], bool] | None] = (
            queue.Queue()
        )
        self._error: BaseException | None = None
        self._optuna_trial: Any = None
        self._pruning_supported = True
        self._thread = threading.Thread(target=self._run, name="slotsweep-recorder", daemon=True)
        self._thread.start()
        # Pay for the imports now, in this thread, while the main thread builds the model.
        self.submit(self._warm_up)

    # -- the queue ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, future, background = item
            try:
                future.set_result(fn())
            except BaseException as error:
                future.set_exception(error)
                if background and self._error is None:
                    self._error = error
                    print(
                        f"slotsweep: recording to the database failed: {error!r}",
                        file=sys.stderr,
                        flush=True,
                    )

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` (fire and forget; its error surfaces at the next :meth:`call`)."""
        self._tasks.put((fn, Future(), True))

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` after everything queued so far and return its result."""
        future: Future[T] = Future()
        self._tasks.put((fn, future, False))
        result = future.result()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"an earlier database write failed: {error!r}") from error
        return result

    def flush(self) -> None:
        """Wait until every queued write is committed."""
        self.call(lambda: None)

    def close(self, timeout: float = 60.0) -> None:
        """Commit what is queued and stop the thread (bounded: exit must not hang)."""
        if not self._thread.is_alive():
            return
        self._tasks.put(None)
        self._thread.join(timeout)

    # -- database helpers (run in the recorder's thread) -----------------------------

    def _warm_up(self) -> None:
        import storage  # noqa: F401  (import cost paid here, not on the training path)

        if self.spec.pruning:
            import optuna  # noqa: F401

    def _session(self) -> Any:
        from storage import session_scope

        return session_scope(self.spec.db_url)

    def _update_trial(self, session: Session, **fields: Any) -> None:
        from sqlalchemy import update

        from storage import Trial

        session.execute(update(Trial).where(Trial.id == self.spec.trial_id).values(**fields))

    # -- what the runtime records ----------------------------------------------------

    def training_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged training metrics at ``step`` (batches trained), and the progress."""
        values = dict(values)

        def write() -> None:
            from storage import MetricKind, record_metrics

            with self._session() as session:
                record_metrics(
                    session, self.spec.trial_id, step, MetricKind.TRAINING, values, epoch
                )
                self._update_trial(session, total_batches=step)

        self.submit(write)

    def validation_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        """Averaged validation metrics; the searcher metric also goes on the trial row."""
        values = dict(values)
        metric = values.get(self.spec.searcher_metric)

        def write() -> None:
            from storage import MetricKind, record_metrics

            with self._session() as session:
                record_metrics(
                    session, self.spec.trial_id, step, MetricKind.VALIDATION, values, epoch
                )
                fields: dict[str, Any] = {"total_batches": step}
                if metric is not None:
                    # A NaN (diverged) value clears the last finite one: the driver then
                    # reports the divergence rather than rank an earlier, better value.
                    value = float(metric)
                    fields["searcher_metric_value"] = None if math.isnan(value) else value
                self._update_trial(session, **fields)

        self.submit(write)

    def rewind(self, step: int) -> None:
        """Forget what an earlier attempt recorded past ``step`` (the restored checkpoint).

        That attempt's later metrics and timings belong to a timeline that was abandoned;
        the restored run records its own (metrics by upsert, timings as new windows).
        """

        def write() -> None:
            from sqlalchemy import delete

            from storage import Metric, Timing

            with self._session() as session:
                trial_id = self.spec.trial_id
                session.execute(
                    delete(Metric).where(Metric.trial_id == trial_id, Metric.step > step)
                )
                session.execute(
                    delete(Timing).where(Timing.trial_id == trial_id, Timing.end_step > step)
                )
                self._update_trial(session, total_batches=step)

        self.submit(write)

    def timings(self, windows: Sequence[TimingWindow]) -> None:
        if not windows:
            return
        rows = list(windows)

        def write() -> None:
            from storage import Timing

            with self._session() as session:
                session.add_all(
                    Timing(
                        trial_id=self.spec.trial_id,
                        name=w.name,
                        start_step=w.start_step,
                        end_step=w.end_step,
                        count=w.count,
                        mean_s=w.mean_s,
                        p50_s=w.p50_s,
                        p95_s=w.p95_s,
                        total_s=w.total_s,
                    )
                    for w in rows
                )

        self.submit(write)

    def checkpoint(
        self,
        *,
        uuid: str,
        step: int,
        epoch: float | None,
        path: Path,
        size_bytes: int,
        metrics: Mapping[str, float],
        trial_running: bool,
    ) -> list[str]:
        """Record a written checkpoint, then collect garbage; returns the deleted uuids.

        Synchronous: when it returns, a restart can find this checkpoint.
        """
        # JSON has no NaN or infinity (PostgreSQL refuses them); null ranks as "no value".
        finite = {name: float(v) if math.isfinite(v) else None for name, v in metrics.items()}

        def write() -> list[str]:
            from storage import Checkpoint, CheckpointState

            with self._session() as session:
                session.add(
                    Checkpoint(
                        uuid=uuid,
                        trial_id=self.spec.trial_id,
                        step=step,
                        epoch=epoch,
                        path=str(path),
                        size_bytes=size_bytes,
                        metrics=finite,
                        state=CheckpointState.COMPLETED,
                    )
                )
            return self._collect_garbage(trial_running)

        return self.call(write)

    def _collect_garbage(self, trial_running: bool) -> list[str]:
        with self._session() as session:
            return collect_garbage(
                session,
                experiment_id=self.spec.experiment_id,
                policy=self.spec.checkpoint_storage,
                metric=self.spec.searcher_metric,
                smaller_is_better=self.spec.smaller_is_better,
                trial_id=self.spec.trial_id,
                trial_running=trial_running,
            )

    def report_intermediate(self, value: float, step: int) -> None:
        """Report the searcher metric at ``step`` to the Optuna trial (for its pruner and plots)."""

        def report() -> None:
            trial = self._load_optuna_trial()
            if trial is not None:
                trial.report(float(value), step)

        self.submit(report)

    def should_prune(self) -> bool:
        """Ask the study's pruner about the values reported so far."""

        def ask() -> bool:
            trial = self._load_optuna_trial()
            return trial is not None and bool(trial.should_prune())

        return self.call(ask)

    def _load_optuna_trial(self) -> Any:
        if self._optuna_trial is not None or not self._pruning_supported:
            return self._optuna_trial
        import optuna

        from storage import optuna_storage

        pruner = self.spec.pruner.build() if self.spec.pruner is not None else None
        study = optuna.load_study(
            study_name=self.spec.study_name,
            storage=optuna_storage(self.spec.db_url),
            pruner=pruner,
        )
        if len(study.directions) > 1:
            print(
                "slotsweep: pruning is single-objective; this study has several objectives, "
                "so the trial is never pruned",
                file=sys.stderr,
                flush=True,
            )
            self._pruning_supported = False
            return None
        self._optuna_trial = optuna.trial.Trial(study, self.spec.optuna_trial_id)
        return self._optuna_trial

    def finished(self, total_batches: int) -> None:
        """The user's training ran to its end: the driver will mark the trial COMPLETED."""

        def write() -> None:
            from storage import utcnow

            with self._session() as session:
                self._update_trial(session, total_batches=total_batches, finished_at=utcnow())

        self.call(write)

    def pruned(self, total_batches: int) -> None:
        """The pruner stopped the trial: the driver will mark it PRUNED."""

        def write() -> None:
            from storage import utcnow

            with self._session() as session:
                self._update_trial(session, total_batches=total_batches, pruned_at=utcnow())

        self.call(write)
