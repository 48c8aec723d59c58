"""A cross-process lock around creating and upgrading a database's schema.

Two searches started at once against a new database would otherwise both create
Optuna's tables and both insert its version row; one of them would crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from sqlalchemy import text
from sqlalchemy.engine import make_url

# Any fixed 64-bit key; PostgreSQL advisory locks are per database.
_PG_LOCK_KEY = 0x510754EE9


@contextlib.contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Hold an exclusive lock for ``url``'s schema: a file lock for SQLite files,
    an advisory lock on PostgreSQL, nothing for in-memory databases."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            yield
            return
        with open(os.path.abspath(database) + ".schema-lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    elif backend == "postgresql":
        from storage._engine import get_engine

        with get_engine(url).connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK_KEY})
            connection.commit()
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK_KEY})
                connection.commit()
    else:
        yield
