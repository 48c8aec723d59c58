"""Rank 0's one database thread: writes applied in order, each a fenced transaction.

:class:`RecorderQueue` is what :class:`~trials.runtime._recorder.ChiefRecorder` records
through: :meth:`~RecorderQueue.submit` queues a write (a training step never waits for
the database), :meth:`~RecorderQueue.call` waits for its answer and for everything
queued before it. Every transaction is fenced (``storage.claim_attempt``) and re-run
whole while the database is briefly unreachable (``storage.retry_transient``); an
attempt that lost its trial, or a database gone past the deadline, ends the rank with
:class:`TrialStopped` at its next use of the queue.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from trials.config import RuntimeSpec

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

T = TypeVar("T")


class TrialStopped(RuntimeError):
    """The rank must stop now, without recording anything more (one line says why).

    Raised in the training thread at the recorder's next use, after its thread found
    this attempt superseded or the database unreachable past the deadline. It carries
    no SQLAlchemy type, so ranks that never import SQLAlchemy can catch it.
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# Exit codes: 3 for an attempt that lost its trial to a newer one (not a failure of
# this attempt's own making), 1 for a failure (the database stayed unreachable).
SUPERSEDED_EXIT_CODE = 3
FAILURE_EXIT_CODE = 1


class RecorderQueue:
    """One thread applying rank 0's database work in order, each piece fenced."""

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._tasks: queue.Queue[tuple[Callable[[], Any], Future[Any], bool] | None] = (
            queue.Queue()
        )
        self._error: BaseException | None = None
        # Set once by the recorder's thread; from then on nothing more is recorded.
        self._stopped: TrialStopped | None = None
        self._run_id: int | None = None
        # The driver's stop request (pause, preemption), as of the last commit: set by
        # the recorder's thread, read by the training loop at its next report.
        self.stop_requested = False
        self._thread = threading.Thread(target=self._run, name="slotsweep-recorder", daemon=True)
        self._thread.start()
        # Pay for the imports now, in this thread, while the main thread builds the model.
        self.submit(self._warm_up)

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, future, background = item
            if self._stopped is not None:
                future.set_exception(self._stopped)
                continue
            try:
                future.set_result(fn())
            except BaseException as error:
                stopped = _as_stop(error)
                if stopped is not None:
                    self._stopped = stopped
                    future.set_exception(stopped)
                    continue
                future.set_exception(error)
                if background and self._error is None:
                    self._error = error
                    print(
                        f"slotsweep: recording to the database failed: {error!r}",
                        file=sys.stderr,
                        flush=True,
                    )

    def submit(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` (fire and forget; its error surfaces at the next :meth:`call`).

        Raises :class:`TrialStopped` once the rank must stop, so that the training
        thread stops at its next report rather than train on for nothing.
        """
        if self._stopped is not None:
            raise self._stopped
        self._tasks.put((fn, Future(), True))

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` after everything queued so far and return its result."""
        future: Future[T] = Future()
        self._tasks.put((fn, future, False))
        result = future.result()
        if self._stopped is not None:
            raise self._stopped
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

    def _transaction(self, body: Callable[[Session], T]) -> T:
        """``body`` in one fenced transaction, re-run while the database is unreachable."""
        from storage import claim_attempt, retry_transient, session_scope, stop_requested

        def attempt() -> T:
            with session_scope(self.spec.db_url) as session:
                self._run_id = claim_attempt(session, self.spec.trial_id, self.spec.attempt)
                if self._run_id is not None and not self.stop_requested:
                    # Read with every record, so asking costs the training loop nothing.
                    self.stop_requested = stop_requested(session, self._run_id)
                return body(session)

        return retry_transient(attempt)

    def _update_trial(self, session: Session, **fields: Any) -> None:
        from sqlalchemy import update

        from storage import Trial

        session.execute(update(Trial).where(Trial.id == self.spec.trial_id).values(**fields))


def _as_stop(error: BaseException) -> TrialStopped | None:
    """The :class:`TrialStopped` that ``error`` calls for, if it is one of those ends."""
    from storage import AttemptSupersededError, DatabaseUnavailableError

    if isinstance(error, TrialStopped):
        return error
    if isinstance(error, AttemptSupersededError):
        return TrialStopped(str(error), SUPERSEDED_EXIT_CODE)
    if isinstance(error, DatabaseUnavailableError):
        return TrialStopped(str(error), FAILURE_EXIT_CODE)
    return None
