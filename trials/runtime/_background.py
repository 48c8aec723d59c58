"""One piece of work at a time beside the training thread, its outcome collected later.

Rank 0's checkpoint writes with ``checkpoint_storage.async_upload``
(:class:`~trials.runtime._checkpoint.TrialCheckpoints`): the training thread starts a
write and goes on; the next write, and the trial's end, first :meth:`~Background.wait`
for the one before, which raises the error it failed with (a refused upload, a
superseded attempt) in the training thread, where the runner turns it into the trial's
failure. At most one write runs, so checkpoints are recorded in the order they were
taken and only one serialised checkpoint is held in memory beside the model.

The thread is a daemon: a rank that dies (or exits after a failure it reported) is not
held up by an upload that nobody will record.

Example:
    >>> background = Background("example")
    >>> background.start(lambda: None)
    >>> background.wait()
    >>> background.start(lambda: 1 / 0)
    >>> background.wait()
    Traceback (most recent call last):
    ...
    ZeroDivisionError: division by zero
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """Runs one callable at a time on a thread of its own; :meth:`wait` collects it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, work: Callable[[], None]) -> None:
        """Run ``work`` on a new thread, once the previous work has ended (see :meth:`wait`)."""
        self.wait()

        def run() -> None:
            try:
                work()
            except BaseException as error:  # raised again in the caller's thread by wait()
                self._error = error

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Wait for the work started last; raise the error it failed with, once."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
