"""The attempt's fenced start (``storage.start_ranks``), passed once per node before its ranks start.

No rank may touch a device before its run has passed ``storage.start_ranks`` (the run
not ended, its slot claim still held, the run marked started): its driver may have
been stopped between recording the run and starting it, and the slots be another
trial's by now. Each node's ``torchrun`` wrapper (:mod:`trials.node.torchrun`) passes
it for the ranks it is about to start: :class:`NodeFence` runs the check in a forked
child while the wrapper imports torch (torchrun's own start-up, a second or more on a
core the ranks do not use yet), and the wrapper starts torchrun only once it passed,
naming the attempt in :data:`FENCE_PASSED_ENV_VAR`. A rank that finds its own attempt
named there (:func:`rank_fenced_start`) checks nothing, so it imports neither
``storage`` nor SQLAlchemy nor a database driver (rank 0 still does, in its recorder's
thread). A rank started any other way (plain ``torchrun``), or whose wrapper's check
failed otherwise than fenced (the database unreachable), checks for itself as before.

Imports ``storage`` only inside the check, so a rank that skips it never loads it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trials.config import RuntimeSpec

#: ``TRIAL_ID:ATTEMPT`` of the attempt this node's wrapper passed the fence for.
FENCE_PASSED_ENV_VAR = "SLOTSWEEP_FENCE_PASSED"


def passed_marker(spec: RuntimeSpec) -> str:
    """What :data:`FENCE_PASSED_ENV_VAR` holds once ``spec``'s attempt passed the fence."""
    return f"{spec.trial_id}:{spec.attempt}"


def fenced_start(spec: RuntimeSpec) -> int | None:
    """Check, before anything touches a device, that this run may start; else its exit code.

    A refused run exits with ``storage.FENCED_EXIT_CODE``, after one line saying why.
    """
    from storage import (
        FENCED_EXIT_CODE,
        RanksFencedError,
        get_engine,
        retry_transient,
        session_scope,
        start_ranks,
    )

    def check() -> None:
        with session_scope(spec.db_url) as session:
            start_ranks(session, spec.trial_id, spec.attempt)

    try:
        retry_transient(check)
    except RanksFencedError as fenced:
        print(f"slotsweep: {fenced}", file=sys.stderr, flush=True)
        return FENCED_EXIT_CODE
    finally:
        # No process keeps an idle pooled connection for the whole trial (one per rank
        # adds up on PostgreSQL). The engine stays usable.
        get_engine(spec.db_url).dispose()
    return None


def rank_fenced_start(spec: RuntimeSpec) -> int | None:
    """A rank's fenced start: nothing to do when its node's wrapper passed it for this
    attempt (:data:`FENCE_PASSED_ENV_VAR`), else :func:`fenced_start`."""
    if os.environ.get(FENCE_PASSED_ENV_VAR) == passed_marker(spec):
        return None
    return fenced_start(spec)


class NodeFence:
    """:func:`fenced_start` for this node's ranks, run in a forked child meanwhile.

    Fork it before importing torch (the process must have no threads yet), then
    :meth:`verdict` before starting torchrun.
    """

    def __init__(self, spec: RuntimeSpec) -> None:
        self.spec = spec
        # Only this wrapper's own pass may tell its ranks to skip the check.
        os.environ.pop(FENCE_PASSED_ENV_VAR, None)
        sys.stdout.flush()
        sys.stderr.flush()
        self._pid = os.fork()
        if self._pid == 0:  # the child: the check, then out without the parent's teardown
            code = 1
            try:
                code = fenced_start(spec) or 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def verdict(self) -> int | None:
        """``storage.FENCED_EXIT_CODE`` when the run may not start, else None.

        None also when the check failed otherwise (it printed why): the ranks then check
        for themselves. Once the check passed, the ranks started from now on inherit
        :data:`FENCE_PASSED_ENV_VAR` and skip theirs.
        """
        _, status = os.waitpid(self._pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            os.environ[FENCE_PASSED_ENV_VAR] = passed_marker(self.spec)
            return None
        # Imported only here: a start that passed never loads storage in this process.
        from storage import FENCED_EXIT_CODE

        return FENCED_EXIT_CODE if code == FENCED_EXIT_CODE else None
