"""Engines and sessions that many processes can share safely.

SQLite is the embedded default and several processes (the driver, rank 0 of every
running trial, the UI) write to one file at once. Two things keep that free of
"database is locked": WAL mode (readers never block the writer) with a busy timeout,
and ``BEGIN IMMEDIATE`` for every transaction, so a transaction takes the write lock
up front instead of failing when it upgrades a stale read snapshot (SQLite does not
call the busy handler in that case). Switching a new file to WAL is the one upgrade
left outside a transaction; it is retried (:func:`_switch_to_wal`).

A database that goes away for a while (a PostgreSQL restart, a SQLite file held locked
past the busy timeout) must not take a running trial down: :func:`retry_transient`
re-runs a whole transaction while :func:`is_transient_error` says the failure was the
connection's, not the statement's, up to a bounded total wait.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from storage._url import resolve_db_url

SQLITE_BUSY_TIMEOUT_S = 60.0
# How long a writer keeps re-running a transaction while the database is unreachable.
TRANSIENT_DEADLINE_S = 120.0

# Set inside :func:`reading_only`: the transactions begun there are deferred.
_READING_ONLY = contextvars.ContextVar("slotsweep_reading_only", default=False)
# Between two tries at SQLite's write lock (:func:`_begin_immediate`).
_BEGIN_RETRY_MIN_S = 0.0002
_BEGIN_RETRY_MAX_S = 0.002
_log = logging.getLogger(__name__)
T = TypeVar("T")


def _make_sqlite_shareable(engine: Engine, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling is turned off so that ours (below) is used.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        if not read_only:
            _switch_to_wal(cursor)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        if read_only or _READING_ONLY.get():
            connection.exec_driver_sql("BEGIN")
        else:
            _begin_immediate(connection.connection.driver_connection)


@contextlib.contextmanager
def reading_only() -> Iterator[None]:
    """Transactions begun inside this block only read: on SQLite they start deferred.

    A deferred transaction reads a snapshot and never takes the write lock, so a long
    read (Optuna's trials, parsed into objects while the transaction is open) makes no
    writer wait. Only for transactions that write nothing: one that wrote after reading
    would fail at once, not wait, if another writer had committed since its read.
    A read-only engine (``get_engine(url, read_only=True)``, the UI's) defers every
    transaction it begins; this block defers those begun on a writing engine for a
    while (the reads of :func:`storage.optuna_storage`'s storage).

    Example:
        >>> with reading_only(), session_scope("sqlite://") as session:
        ...     session.execute(sqlalchemy.text("select 1")).scalar_one()
        1
    """
    token = _READING_ONLY.set(True)
    try:
        yield
    finally:
        _READING_ONLY.reset(token)


def _begin_immediate(dbapi_connection: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, retried every millisecond or so while another writer holds the lock.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25 ... 100 ms between tries:
    a writer that came a moment after another one's 2 ms transaction often waits 8 ms,
    and one that waited a while sleeps 25-100 ms at a time whatever the lock does
    (measured on a search with two warm jobs: rank 0's waits were 80 ms at the 99th
    percentile behind transactions that held the lock 13 ms). Taking the lock is
    retried here at a fine grain instead, with the busy timeout off for that one
    statement and back on for the transaction's own. The total wait is bounded as before.
    """
    dbapi_connection.execute("PRAGMA busy_timeout = 0")
    try:
        _while_locked(
            lambda: dbapi_connection.execute("BEGIN IMMEDIATE"),
            first_delay_s=_BEGIN_RETRY_MIN_S,
            max_delay_s=_BEGIN_RETRY_MAX_S,
        )
    finally:
        dbapi_connection.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")


def _switch_to_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds the file.

    On a brand-new file (still in rollback mode) two processes connecting at once each
    take a read lock and then want the write lock to convert it. SQLite fails one of
    them at once with "database is locked" rather than calling its busy handler (both
    waiting would deadlock), so the busy timeout does not cover this: two drivers
    started together on a new database would see one of them refuse to open it. Once
    the file is in WAL mode (a persistent property), the statement needs no lock.
    """
    _while_locked(
        lambda: cursor.execute("PRAGMA journal_mode = WAL"), first_delay_s=0.005, max_delay_s=0.2
    )


def _while_locked(
    statement: Callable[[], Any], *, first_delay_s: float, max_delay_s: float
) -> None:
    """``statement()``, run again after a doubling sleep while SQLite says "locked".

    For at most the busy timeout; any other error, or the last one, propagates.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay_s = first_delay_s
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay_s)
        delay_s = min(2 * delay_s, max_delay_s)


def prepare_engine(engine: Engine, read_only: bool = False) -> Engine:
    """Apply slotsweep's SQLite settings to an engine someone else created (Optuna's).

    Pooled connections made before the listeners existed are dropped, so every
    connection from now on has the settings.
    """
    if engine.url.get_backend_name() == "sqlite":
        _make_sqlite_shareable(engine, read_only=read_only)
        engine.dispose()
    return engine


def engine_kwargs(url: str) -> dict[str, Any]:
    """Keyword arguments for ``create_engine`` that suit ``url``'s backend."""
    if make_backend(url) == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}}
    return {"pool_pre_ping": True}


def make_backend(url: str) -> str:
    return sqlalchemy.engine.make_url(url).get_backend_name()


@functools.lru_cache(maxsize=16)
def get_engine(url: str | None = None, read_only: bool = False) -> Engine:
    """One engine per (URL, mode) and process.

    ``read_only`` engines (the UI) start deferred transactions, so a reader never holds
    the write lock and never makes a writer wait.

    Example:
        >>> engine = get_engine("sqlite://")
        >>> engine.url.get_backend_name()
        'sqlite'
    """
    resolved = resolve_db_url(url)
    engine = sqlalchemy.create_engine(resolved, **engine_kwargs(resolved))
    return prepare_engine(engine, read_only=read_only)


@functools.lru_cache(maxsize=16)
def _session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextlib.contextmanager
def session_scope(url_or_engine: str | Engine | None = None) -> Iterator[Session]:
    """A session committed on success and rolled back on error.

    Example:
        >>> with session_scope("sqlite://") as session:
        ...     session.execute(sqlalchemy.text("select 1")).scalar()
        1
    """
    engine = url_or_engine if isinstance(url_or_engine, Engine) else get_engine(url_or_engine)
    session = _session_factory(engine)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# SQLSTATE classes and codes that mean the connection, not the statement, failed:
# class 08 (connection exception), 57P01-57P03 (admin or crash shutdown, starting up);
# and those of a transaction the server aborted for another's sake, which succeeds when
# run again: 40P01 (chosen to break a deadlock: two drivers releasing and claiming
# slots locked the same rows in opposite orders) and 40001 (serialization failure).
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "57P01", "57P02", "57P03", "40P01", "40001")
# Messages of the same failures where the driver gives no SQLSTATE (refused at connect,
# SQLite's busy timeout running out).
_TRANSIENT_MESSAGES = (
    "database is locked",
    "connection refused",
    "could not connect",
    "connection failed",
    "server closed the connection",
    "terminating connection",
    "connection reset",
    "connection timed out",
    "connection is closed",
    "connection is lost",
    "the database system is",
    "consuming input failed",
    "ssl syscall error",
    "broken pipe",
)


class DatabaseUnavailableError(RuntimeError):
    """The database stayed unreachable for longer than the caller was willing to wait."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    # Optuna wraps SQLAlchemy's errors (StorageInternalError from OperationalError), and
    # SQLAlchemy wraps the DBAPI's: the cause can sit a few links down.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient_error(exc: BaseException) -> bool:
    """Whether ``exc`` means "the connection was lost, refused or locked", or "the
    server aborted this transaction to let another go on" (worth a retry).

    A constraint violation, a syntax error or a missing table is not transient: running
    the same transaction again would fail the same way.

    Example:
        >>> is_transient_error(sqlite3.OperationalError("database is locked"))
        True
        >>> is_transient_error(sqlite3.OperationalError("no such table: x"))
        False
    """
    for link in _chain(exc):
        if isinstance(link, sqlalchemy.exc.DisconnectionError):
            return True
        if isinstance(link, sqlalchemy.exc.DBAPIError) and link.connection_invalidated:
            return True
        if isinstance(link, sqlalchemy.exc.StatementError) and not isinstance(
            link, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)
        ):
            continue  # e.g. IntegrityError: look no further than what it wraps
        sqlstate = getattr(link, "sqlstate", None) or getattr(link, "pgcode", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(_TRANSIENT_SQLSTATE_PREFIXES):
            return True
        if type(link).__name__ in ("OperationalError", "InterfaceError"):
            message = str(link).lower()
            if any(marker in message for marker in _TRANSIENT_MESSAGES):
                return True
    return False


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def retry_transient(fn: Callable[[], T], *, deadline_s: float = TRANSIENT_DEADLINE_S) -> T:
    """``fn()``, re-run with backoff while it fails transiently, for at most ``deadline_s``.

    ``fn`` must be a whole transaction (it opens and commits its own session) and
    idempotent: a commit whose acknowledgement was lost is run again. Errors that are
    not transient propagate at once; past the deadline a
    :class:`DatabaseUnavailableError` names how long it waited and the last error.

    Example:
        >>> def write() -> int:
        ...     with session_scope("sqlite://") as session:
        ...         return session.execute(sqlalchemy.text("select 1")).scalar_one()
        >>> retry_transient(write, deadline_s=10.0)
        1
    """
    deadline = time.monotonic() + deadline_s
    delay_s = 0.1
    warned = False
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not is_transient_error(exc):
                raise
            if time.monotonic() + delay_s > deadline:
                raise DatabaseUnavailableError(
                    f"the database was unreachable for {deadline_s:g} s: {_first_line(exc)}"
                ) from exc
            if not warned:
                _log.warning(
                    "database unreachable (%s); retrying for up to %g s",
                    _first_line(exc),
                    deadline_s,
                )
                warned = True
        else:
            if warned:
                _log.warning("database reachable again")
            return result
        time.sleep(delay_s)
        delay_s = min(2 * delay_s, 2.0)
