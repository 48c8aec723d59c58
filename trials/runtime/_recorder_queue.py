"""Rank 0's one database thread: writes applied in order, each a fenced transaction.

:class:`RecorderQueue` is what :class:`~trials.runtime._recorder.ChiefRecorder` records
through: :meth:`~RecorderQueue.submit_write` queues a write (a training step never
waits for the database), :meth:`~RecorderQueue.call_write` and
:meth:`~RecorderQueue.call` wait for their answer and for everything queued before.
Writes that queued up while the thread was busy, or within :data:`GROUP_COMMIT_S` of a
background write, commit together, in one transaction (a trial's end is usually its
last metrics, its end and a warm job's hand-back): one fence, one commit and one wait
for SQLite's write lock instead of three. Should that
transaction fail, each write runs again alone, so each keeps its own outcome.
Every transaction is fenced (``storage.claim_attempt``) and re-run
whole while the database is briefly unreachable (``storage.retry_transient``); an
attempt that lost its trial, or a database gone past the deadline, ends the rank with
:class:`TrialStopped` at its next use of the queue.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
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

# How long a background write waits for more writes to share its transaction. A trial's
# last metric is queued a millisecond or two before its end and a warm job's hand-back:
# one fenced transaction and one commit between two trials instead of two. Nothing
# waits on a background write, so the delay costs nothing; a caller's write (or any
# other work) that arrives meanwhile ends the wait at once.
GROUP_COMMIT_S = 0.01


@dataclass
class _Task:
    """One piece of rank 0's database work: a fenced transaction's ``body``, or other ``work``."""

    future: Future[Any]
    # Its failure is reported at the next :meth:`RecorderQueue.call` (fire and forget).
    background: bool
    body: Callable[[Session], Any] | None = None
    work: Callable[[], Any] | None = None


class RecorderQueue:
    """One thread applying rank 0's database work in order, each piece fenced.

    Writes queued while the thread was busy share one transaction (one fence, one
    commit): a trial's last metrics, its end and a warm job's hand-back are one commit.
    """

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        self._tasks: queue.Queue[_Task | None] = queue.Queue()
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
        # A task taken from the queue behind a run of writes, applied after them.
        held: list[_Task | None] = []
        while True:
            task = held.pop() if held else self._tasks.get()
            if task is None:
                return
            batch = [task]
            # Nobody waits for a batch of background writes: it waits a moment for the
            # writes that usually follow (a trial's last metric, then its end).
            linger_until = time.monotonic() + GROUP_COMMIT_S
            while task.body is not None:
                try:
                    if batch[-1].background:
                        task = self._tasks.get(timeout=max(0.0, linger_until - time.monotonic()))
                    else:
                        task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is None or task.body is None:
                    held.append(task)
                    break
                batch.append(task)
            self._apply(batch)

    def _apply(self, batch: list[_Task]) -> None:
        """Run ``batch`` (one piece of work, or writes queued one after another)."""
        if len(batch) == 1:
            self._settle(batch[0])
            return
        if self._stopped is not None:
            for task in batch:
                task.future.set_exception(self._stopped)
            return
        bodies = [task.body for task in batch if task.body is not None]
        try:
            results = self._transaction(lambda session: [body(session) for body in bodies])
        except BaseException as error:
            stopped = _as_stop(error)
            if stopped is None:
                # One of them failed: each runs alone, so each keeps its own outcome (the
                # failed transaction was rolled back whole).
                for task in batch:
                    self._settle(task)
                return
            self._stopped = stopped
            for task in batch:
                task.future.set_exception(stopped)
            return
        for task, result in zip(batch, results, strict=True):
            task.future.set_result(result)

    def _settle(self, task: _Task) -> None:
        """Run one task in a transaction of its own (or as it is, not a write)."""
        if self._stopped is not None:
            task.future.set_exception(self._stopped)
            return
        body, work = task.body, task.work
        try:
            if body is not None:
                task.future.set_result(self._transaction(body))
            else:
                assert work is not None
                task.future.set_result(work())
        except BaseException as error:
            stopped = _as_stop(error)
            if stopped is not None:
                self._stopped = stopped
                task.future.set_exception(stopped)
                return
            task.future.set_exception(error)
            if task.background and self._error is None:
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
        self._put(_Task(Future(), background=True, work=fn))

    def submit_write(self, body: Callable[[Session], Any]) -> None:
        """Queue ``body`` to run in a fenced transaction, as :meth:`submit` queues work."""
        self._put(_Task(Future(), background=True, body=body))

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` after everything queued so far and return its result."""
        future: Future[T] = Future()
        self._tasks.put(_Task(future, background=False, work=fn))
        return self._result(future)

    def call_write(self, body: Callable[[Session], T]) -> T:
        """Run ``body`` in a fenced transaction after everything queued so far; its result.

        Writes still queued share its transaction.
        """
        future: Future[T] = Future()
        self._tasks.put(_Task(future, background=False, body=body))
        return self._result(future)

    def _put(self, task: _Task) -> None:
        if self._stopped is not None:
            raise self._stopped
        self._tasks.put(task)

    def _result(self, future: Future[T]) -> T:
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
