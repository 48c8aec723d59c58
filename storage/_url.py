"""Where the database is: the default URL, the environment override, safe printing."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

DEFAULT_DB_URL = "sqlite:///slotsweep.db"
DB_ENV_VAR = "SLOTSWEEP_DB"


def resolve_db_url(url: str | None = None) -> str:
    """Return ``url`` if given, else ``$SLOTSWEEP_DB``, else the SQLite file in the cwd.

    Example:
        >>> resolve_db_url("sqlite:///x.db")
        'sqlite:///x.db'
    """
    return url or os.environ.get(DB_ENV_VAR) or DEFAULT_DB_URL


def redact_url(url: str) -> str:
    """The URL with its password masked, for messages and logs.

    Example:
        >>> redact_url("postgresql://me:secret@db/sweeps")
        'postgresql://me:***@db/sweeps'
    """
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # An unparsable URL is reported by whoever parses it next.
        return "<unparsable database URL>"


def absolute_db_url(url: str, base_dir: str | None = None) -> str:
    """``url`` with a relative SQLite path made absolute.

    Trials run in their own working directory; ``sqlite:///slotsweep.db`` must still
    mean the driver's file.

    Example:
        >>> absolute_db_url("sqlite:///x.db", "/work")
        'sqlite:////work/x.db'
    """
    import os

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return url
    if parsed.database == ":memory:" or parsed.database.startswith("file:"):
        return url
    path = os.path.join(base_dir or os.getcwd(), os.path.expanduser(parsed.database))
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)
