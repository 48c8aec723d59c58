"""How a rank failed, written to the database by the rank itself before it exits.

Every rank whose trial code raises records one ``storage.TrialFailure`` row under its
attempt's run: the exception's class name, the first line of its message, the last
frames of its traceback and how many optimizer steps the run had completed. The driver,
``slotsweep describe`` and the UI read the reason from there instead of leaving it in
a log under torchrun's tracebacks, and the driver tells a deterministic failure (the
same error on every rank before the first step) from one worth a restart.

Only failing ranks pay for SQLAlchemy here: the import happens on this path, so ranks
other than 0 still start without it. The write is fenced like every other
(``storage.claim_attempt``; it does not count as progress), retried while the database
is briefly unreachable, and bounded as a whole: a rank that fails must still exit.
A rank killed by a signal runs no Python code and records nothing.
"""

from __future__ import annotations

import sys
import threading
import traceback

from trials.config import RuntimeSpec

# A message is one line; tracebacks keep their last frames (where the error happened).
MESSAGE_MAX_CHARS = 1000
TRACEBACK_FRAMES = 15
TRACEBACK_MAX_CHARS = 8000
WRITE_TIMEOUT_S = 10.0


def failure_fields(error: BaseException) -> dict[str, str]:
    """``exception_type``, ``message`` (first line, capped) and ``traceback`` of ``error``.

    Example:
        >>> try:
        ...     1 / 0
        ... except ZeroDivisionError as error:
        ...     fields = failure_fields(error)
        >>> fields["exception_type"], fields["message"]
        ('ZeroDivisionError', 'division by zero')
    """
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > MESSAGE_MAX_CHARS:
        message = message[: MESSAGE_MAX_CHARS - 1] + "…"
    text = "".join(
        traceback.format_exception(
            type(error), error, error.__traceback__, limit=-TRACEBACK_FRAMES
        )
    )
    if len(text) > TRACEBACK_MAX_CHARS:
        text = "…" + text[-(TRACEBACK_MAX_CHARS - 1) :]
    return {"exception_type": type(error).__name__, "message": message, "traceback": text}


def record_failure(
    spec: RuntimeSpec,
    rank: int,
    error: BaseException,
    steps_completed: int,
    *,
    timeout_s: float = WRITE_TIMEOUT_S,
) -> bool:
    """Record that ``rank`` of this attempt failed with ``error``; whether it was written.

    Never raises and never takes longer than about ``timeout_s``: a failure to record
    is one line on stderr, and the rank goes on exiting with its own error.
    """
    fields = failure_fields(error)
    outcome: dict[str, BaseException | bool] = {}

    def write() -> None:
        try:
            outcome["written"] = _write(spec, rank, fields, steps_completed, timeout_s)
        except BaseException as problem:  # reported by the caller's thread
            outcome["error"] = problem

    # A daemon thread: a database that hangs (a PostgreSQL host gone) cannot hold the
    # rank past the timeout.
    thread = threading.Thread(target=write, name="slotsweep-failure", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        _warn(f"the failure was not recorded: the database did not answer in {timeout_s:g} s")
        return False
    if "error" in outcome:
        problem = outcome["error"]
        _warn(f"the failure was not recorded: {type(problem).__name__}: {problem}")
        return False
    return bool(outcome.get("written"))


def _write(
    spec: RuntimeSpec, rank: int, fields: dict[str, str], steps_completed: int, deadline_s: float
) -> bool:
    from sqlalchemy import select

    from storage import (
        AttemptSupersededError,
        TrialFailure,
        claim_attempt,
        retry_transient,
        session_scope,
    )

    def transaction() -> bool:
        with session_scope(spec.db_url) as session:
            run_id = claim_attempt(session, spec.trial_id, spec.attempt, progress=False)
            if run_id is None:
                return False  # no run of this attempt (a hand-made spec): nothing to attach to
            known = session.scalar(
                select(TrialFailure.id).where(
                    TrialFailure.run_id == run_id, TrialFailure.rank == rank
                )
            )
            if known is None:  # else committed by a try whose acknowledgement was lost
                session.add(
                    TrialFailure(
                        run_id=run_id,
                        trial_id=spec.trial_id,
                        rank=rank,
                        steps_completed=max(0, steps_completed),
                        **fields,
                    )
                )
            return True

    try:
        return retry_transient(transaction, deadline_s=deadline_s)
    except AttemptSupersededError:
        return False  # a newer attempt owns the trial; this one's failure is not news


def _warn(message: str) -> None:
    print(f"slotsweep: {message}", file=sys.stderr, flush=True)
