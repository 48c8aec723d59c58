"""Transient database failures and attempt fencing, against real SQLite files."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import exc, select, text

from storage import (
    AttemptSupersededError,
    DatabaseUnavailableError,
    Experiment,
    ExperimentState,
    TrialRun,
    claim_attempt,
    is_transient_error,
    retry_transient,
    session_scope,
    utcnow,
)
from tests.conftest import add_experiment


def _db_file(db_url: str) -> str:
    return db_url.removeprefix("sqlite:///")


def _hold_write_lock(path: str, seconds: float) -> threading.Thread:
    """Another writer: ``BEGIN IMMEDIATE`` on ``path`` held for ``seconds`` (returns once held)."""
    held = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(10)
    return thread


def _impatient_write(path: str) -> None:
    """A write with no busy timeout: fails at once with "database is locked" while locked."""
    connection = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("UPDATE slotsweep_experiments SET max_trials = max_trials + 1")
        connection.execute("COMMIT")
    finally:
        connection.close()


def test_locked_and_lost_connections_are_transient_and_statement_errors_are_not(
    db_url: str,
) -> None:
    path = _db_file(db_url)
    add_experiment(db_url)
    holder = _hold_write_lock(path, 1.0)
    with pytest.raises(sqlite3.OperationalError) as locked:
        _impatient_write(path)
    holder.join()
    assert is_transient_error(locked.value)

    # The same class as a lock's (OperationalError): only what it says tells them apart.
    with (
        pytest.raises(exc.OperationalError, match="no such table: no_such_table") as missing,
        session_scope(db_url) as session,
    ):
        session.execute(text("select * from no_such_table"))
    assert not is_transient_error(missing.value)

    with (
        pytest.raises(exc.IntegrityError, match="UNIQUE constraint failed") as duplicate,
        session_scope(db_url) as session,
    ):
        study = session.scalar(select(Experiment.study_name))
        session.add(
            Experiment(
                name="dup",
                study_name=study,
                state=ExperimentState.ACTIVE,
                config={},
                model_dir=".",
                max_trials=1,
            )
        )
    assert not is_transient_error(duplicate.value)


def test_retry_transient_waits_out_a_lock_and_gives_up_past_its_deadline(db_url: str) -> None:
    path = _db_file(db_url)
    add_experiment(db_url)
    holder = _hold_write_lock(path, 1.0)
    started = time.monotonic()
    retry_transient(lambda: _impatient_write(path), deadline_s=30)
    assert 0.5 < time.monotonic() - started < 10
    holder.join()
    with session_scope(db_url) as session:
        assert session.scalar(select(Experiment.max_trials)) == 2  # written exactly once

    holder = _hold_write_lock(path, 1.5)
    with pytest.raises(
        DatabaseUnavailableError, match=r"unreachable for 0.5 s: database is locked"
    ):
        retry_transient(lambda: _impatient_write(path), deadline_s=0.5)
    holder.join()


def test_retry_transient_does_not_repeat_a_statement_error(db_url: str) -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        with session_scope(db_url) as session:
            session.execute(text("select * from no_such_table"))

    with pytest.raises(exc.OperationalError, match="no such table: no_such_table"):
        retry_transient(broken, deadline_s=30)
    assert len(calls) == 1


def test_claim_attempt_fences_superseded_and_ended_attempts(db_url: str) -> None:
    _, (trial_id,) = add_experiment(db_url)
    with session_scope(db_url) as session:
        assert claim_attempt(session, trial_id, 0) is None  # no run recorded: not fenced
        session.add(TrialRun(trial_id=trial_id, attempt=0))
    with session_scope(db_url) as session:
        run_id = claim_attempt(session, trial_id, 0)
    with session_scope(db_url) as session:
        run = session.get(TrialRun, run_id)
        assert run is not None and run.attempt == 0 and run.progress_at is not None
        stamped = run.progress_at

    with session_scope(db_url) as session:
        session.add(TrialRun(trial_id=trial_id, attempt=1))
    with pytest.raises(AttemptSupersededError) as superseded, session_scope(db_url) as session:
        claim_attempt(session, trial_id, 0)
    assert str(superseded.value) == (
        f"attempt 0 of trial {trial_id} was superseded by attempt 1; stopping without recording"
    )
    with session_scope(db_url) as session:
        run = session.get(TrialRun, run_id)
        assert run is not None and run.progress_at == stamped  # rolled back with the rest

        latest = session.scalars(select(TrialRun).where(TrialRun.attempt == 1)).one()
        latest.ended_at = utcnow()
    with (
        pytest.raises(AttemptSupersededError, match=r"attempt 1 of trial \d+ was ended by the"),
        session_scope(db_url) as session,
    ):
        claim_attempt(session, trial_id, 1)


def test_a_file_that_is_not_sqlite_is_not_transient(tmp_path: Path) -> None:
    # Retrying could never help: the error must surface at once.
    bogus = tmp_path / "not.db"
    bogus.write_bytes(b"plain text, not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError, match=r"^file is not a database$") as error:
        connection = sqlite3.connect(bogus)
        connection.execute("select 1 from sqlite_master")
    assert type(error.value) is sqlite3.DatabaseError  # not its OperationalError subclass
    assert not is_transient_error(error.value)


@pytest.mark.slow
def test_a_transaction_postgresql_aborts_to_break_a_deadlock_is_run_again(
    postgres_url: str,
) -> None:
    # Two writers lock the same two rows in opposite orders (as two drivers releasing
    # and claiming slots did in CI): PostgreSQL aborts one of them with 40P01. That one
    # is transient, and run again it commits after the other: both writes land once.
    url = postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)
    with session_scope(url) as session:
        session.execute(text("CREATE TABLE pair (id integer PRIMARY KEY, writes integer)"))
        session.execute(text("INSERT INTO pair VALUES (1, 0), (2, 0)"))
    both_locked_one = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def writer(first: int, second: int) -> None:
        attempts = 0

        def transaction() -> None:
            nonlocal attempts
            attempts += 1
            try:
                with session_scope(url) as session:
                    bump = "UPDATE pair SET writes = writes + 1 WHERE id = :id"
                    session.execute(text(bump), {"id": first})
                    if attempts == 1:
                        both_locked_one.wait()
                    session.execute(text(bump), {"id": second})
            except Exception as error:
                errors.append(error)
                raise

        retry_transient(transaction, deadline_s=60)

    threads = [threading.Thread(target=writer, args=order) for order in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert len(errors) == 1 and "deadlock detected" in str(errors[0]), errors
    assert is_transient_error(errors[0])
    with session_scope(url) as session:
        assert session.execute(text("SELECT writes FROM pair ORDER BY id")).scalars().all() == [
            2,
            2,
        ]
