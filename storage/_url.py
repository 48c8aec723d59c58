"""Where the database is: the default URL, the environment override, safe printing."""

from __future__ import annotations

import os
from urllib.parse import quote, quote_plus

from sqlalchemy.engine import URL, make_url

DEFAULT_DB_URL = "sqlite:///slotsweep.db"
DB_ENV_VAR = "SLOTSWEEP_DB"
MASK = "***"
# Query parameters whose names contain one of these (any case) hold a secret, e.g.
# libpq's ``password`` and ``sslpassword``: they are masked like the URL's own password.
_SECRET_QUERY_WORDS = ("password", "passwd", "secret", "token")


def resolve_db_url(url: str | None = None) -> str:
    """Return ``url`` if given, else ``$SLOTSWEEP_DB``, else the SQLite file in the cwd.

    Example:
        >>> resolve_db_url("sqlite:///x.db")
        'sqlite:///x.db'
    """
    return url or os.environ.get(DB_ENV_VAR) or DEFAULT_DB_URL


def redact_url(url: str) -> str:
    """The URL with its password masked, for messages and logs.

    Passwords given in the query string (``?password=``, ``?sslpassword=``, any key
    containing "password", "passwd", "secret" or "token") are masked too: libpq accepts them
    there as well as before the ``@``.

    Example:
        >>> redact_url("postgresql://me:secret@db/sweeps")
        'postgresql://me:***@db/sweeps'
        >>> redact_url("postgresql://me@db/sweeps?sslmode=require&PassWord=x")
        'postgresql://me@db/sweeps?PassWord=***&sslmode=require'
    """
    try:
        parsed = make_url(url)
    except Exception:  # An unparsable URL is reported by whoever parses it next.
        return "<unparsable database URL>"
    base = parsed.set(query={}).render_as_string(hide_password=True)
    if not parsed.query:
        return base
    # Rendered by hand: SQLAlchemy would percent-encode the mask in the query string.
    pairs = [
        f"{quote_plus(key)}={MASK if _is_secret_key(key) else quote_plus(value)}"
        for key, value in _query_pairs(parsed)
    ]
    return f"{base}?{'&'.join(pairs)}"


def url_secrets(url: str) -> list[str]:
    """Every secret ``url`` holds: its password and its secret query values, longest first.

    Example:
        >>> url_secrets("postgresql://me:pw@db/x?sslpassword=key-pw&sslmode=require")
        ['key-pw', 'pw']
    """
    try:
        parsed = make_url(url)
    except Exception:  # Nothing can be told apart in an unparsable URL.
        return []
    found = {str(parsed.password)} if parsed.password else set()
    found.update(value for key, value in _query_pairs(parsed) if _is_secret_key(key) and value)
    return sorted(found, key=lambda secret: (-len(secret), secret))


def redact_secrets(text: str, url: str) -> str:
    """``text`` (say, a driver's error message) with every secret of ``url`` masked.

    Drivers sometimes echo the connection string in their errors; this keeps such a
    message printable. Percent-encoded forms of a secret are masked as well.

    Example:
        >>> redact_secrets("bad dsn: password=pw host=db", "postgresql://me:pw@db/x")
        'bad dsn: password=*** host=db'
    """
    for secret in url_secrets(url):
        for form in {secret, quote(secret, safe=""), quote_plus(secret)}:
            text = text.replace(form, MASK)
    return text


def _is_secret_key(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_QUERY_WORDS)


def _query_pairs(parsed: URL) -> list[tuple[str, str]]:
    """The query string as (key, value) pairs, repeated keys kept, in SQLAlchemy's order."""
    pairs: list[tuple[str, str]] = []
    for key in sorted(parsed.query):
        values = parsed.query[key]
        pairs.extend((key, value) for value in ((values,) if isinstance(values, str) else values))
    return pairs


def absolute_db_url(url: str, base_dir: str | None = None) -> str:
    """``url`` with a relative SQLite path made absolute.

    Trials run in their own working directory; ``sqlite:///slotsweep.db`` must still
    mean the driver's file.

    Example:
        >>> absolute_db_url("sqlite:///x.db", "/work")
        'sqlite:////work/x.db'
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return url
    if parsed.database == ":memory:" or parsed.database.startswith("file:"):
        return url
    path = os.path.join(base_dir or os.getcwd(), os.path.expanduser(parsed.database))
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)
