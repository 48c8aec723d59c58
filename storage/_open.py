"""Checks on a database URL a user gave, before anything connects to it or creates it.

Connecting is not a harmless probe: SQLAlchemy creates a missing SQLite file, and
slotsweep's engines switch it to WAL mode. So a command that only reads or controls
existing experiments checks here first and refuses, with one line, a database it
cannot use: a URL that is not one, a driver that is not installed (naming the extra
that installs it), an in-memory SQLite database (trial ranks are other processes and
cannot share it), a file that is not SQLite, and a database without slotsweep's schema.

Example:
    >>> check_database_url("sqlite://", source="--db")
    Traceback (most recent call last):
    ...
    storage._open.DatabaseUrlError: --db: an in-memory SQLite database cannot be shared with the trial processes; use a file, e.g. sqlite:///slotsweep.db
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from storage._models import Experiment
from storage._url import redact_url

POSTGRES_EXTRA = "pip install 'slotsweep[postgres]'"
_SQLITE_HEADER = b"SQLite format 3\x00"
_EXAMPLE_URLS = "e.g. sqlite:///slotsweep.db or postgresql+psycopg://user@host/db"


class DatabaseUrlError(Exception):
    """A database the user named that slotsweep cannot use; the message is one line."""


def check_database_url(url: str, *, source: str, need_schema: bool = False) -> None:
    """Refuse ``url`` with a :class:`DatabaseUrlError` unless slotsweep can use it.

    ``source`` names where the URL came from (``--db``, ``SLOTSWEEP_DB``). With
    ``need_schema`` the database must already hold slotsweep's tables (commands that read
    or control experiments); nothing is created or changed either way.
    """
    try:
        parsed = sqlalchemy.engine.make_url(url)
        dialect = parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        raise DatabaseUrlError(f"{source}: not a database URL; use {_EXAMPLE_URLS}") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise DatabaseUrlError(_missing_driver(source, parsed, exc)) from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed, source=source, need_schema=need_schema)
    elif need_schema:
        _check_server_schema(url, parsed, source=source)


def _missing_driver(source: str, parsed: URL, exc: ImportError) -> str:
    module = exc.name or parsed.get_driver_name()
    if parsed.get_backend_name() != "postgresql":
        return f"{source}: the database driver {module} is not installed"
    if parsed.get_driver_name() == "psycopg2":
        # SQLAlchemy's default for a bare postgresql:// URL; slotsweep's extra is psycopg 3.
        return (
            f"{source}: postgresql:// URLs need psycopg2, which is not installed; install "
            f"psycopg 3 with {POSTGRES_EXTRA} and write postgresql+psycopg://..."
        )
    return f"{source}: the PostgreSQL driver {module} is not installed; {POSTGRES_EXTRA}"


def _check_sqlite(parsed: URL, *, source: str, need_schema: bool) -> None:
    database = parsed.database or ""
    in_memory = (
        database in ("", ":memory:")
        or "mode=memory" in database
        or parsed.query.get("mode") == "memory"
    )
    if in_memory:
        raise DatabaseUrlError(
            f"{source}: an in-memory SQLite database cannot be shared with the trial "
            "processes; use a file, e.g. sqlite:///slotsweep.db"
        )
    if database.startswith("file:"):
        database = database.removeprefix("file:").partition("?")[0]
    path = Path(database).expanduser().resolve()
    if not path.exists():
        if need_schema:
            raise DatabaseUrlError(_no_schema(source, str(path), "the file does not exist"))
        if not path.parent.is_dir():
            raise DatabaseUrlError(f"{source}: folder {path.parent} does not exist")
        return
    if not path.is_file():
        raise DatabaseUrlError(f"{source}: {path} is not a file")
    try:
        with path.open("rb") as stream:
            header = stream.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseUrlError(f"{source}: cannot read {path}: {exc.strerror}") from None
    if header and header != _SQLITE_HEADER:  # An empty file is an empty database.
        raise DatabaseUrlError(f"{source}: {path} is not a SQLite database")
    if need_schema and not _sqlite_has_schema(path, source):
        raise DatabaseUrlError(_no_schema(source, str(path), "it holds no slotsweep tables"))


def _sqlite_has_schema(path: Path, source: str) -> bool:
    # Read-only and without SQLAlchemy's engine: nothing may change in a file that
    # turns out not to be slotsweep's (the engine would switch it to WAL mode).
    try:
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            row = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                (Experiment.__tablename__,),
            ).fetchone()
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        raise DatabaseUrlError(f"{source}: cannot read {path} as SQLite: {exc}") from None
    return row is not None


def _check_server_schema(url: str, parsed: URL, *, source: str) -> None:
    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            present = sqlalchemy.inspect(connection).has_table(Experiment.__tablename__)
    except SQLAlchemyError as exc:
        lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = lines[0] if lines else "connection failed"
        if parsed.password:
            reason = reason.replace(str(parsed.password), "***")  # Drivers may echo the DSN.
        raise DatabaseUrlError(f"{source}: cannot open {redact_url(url)}: {reason}") from None
    finally:
        engine.dispose()
    if not present:
        raise DatabaseUrlError(_no_schema(source, redact_url(url), "it holds no slotsweep tables"))


def _no_schema(source: str, where: str, why: str) -> str:
    return (
        f"{source}: {where} is not a slotsweep database ({why}); "
        "`slotsweep run CONFIG --db ...` creates one"
    )
