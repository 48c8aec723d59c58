"""What every page shares: the database, the refresh interval, links and paging.

The app learns its database from its own command line (``streamlit run app.py --
--db URL``, which is what :func:`ui.launch` runs) and falls back to
``$SLOTSWEEP_DB``, then to the default SQLite file. All reads go through a read-only
engine: deferred transactions that never take SQLite's write lock, so the UI cannot
make the driver or a trial fail with "database is locked".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Callable
from pathlib import Path

import sqlalchemy.exc
import streamlit as st
from sqlalchemy.engine import Engine, make_url

from storage import get_engine, redact_url, resolve_db_url

EXPERIMENTS_PAGE = "pages/experiments.py"
EXPERIMENT_PAGE = "pages/experiment.py"
TRIAL_PAGE = "pages/trial.py"
CLUSTER_PAGE = "pages/cluster.py"

REFRESH_CHOICES: dict[str, float | None] = {
    "off": None,
    "2 s": 2.0,
    "5 s": 5.0,
    "10 s": 10.0,
    "30 s": 30.0,
}
DEFAULT_REFRESH = "5 s"
PAGE_SIZE = 50


def db_url(argv: list[str] | None = None) -> str:
    """The database URL from ``--db`` on the app's command line, else the environment."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--db", default=None)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return resolve_db_url(known.db)


def _missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names, if it does not exist (connecting would create it)."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    path = Path(database).expanduser()
    return None if path.exists() else path


def engine() -> Engine:
    """The read-only engine of the app's database."""
    return get_engine(db_url(), read_only=True)


def require_database() -> Engine:
    """The engine, or a plain message and a stopped page when there is nothing to read."""
    from ui import _queries

    url = db_url()
    missing = _missing_sqlite_file(url)
    if missing is not None:
        st.info(
            f"No database file at `{missing}` yet. Start a search with "
            "`slotsweep run CONFIG` (or pass `--db URL`) and this page fills in."
        )
        st.stop()
    try:
        eng = engine()
        ready = _queries.has_schema(eng)
    except sqlalchemy.exc.SQLAlchemyError as exc:
        st.error(f"Cannot read the database `{redact_url(url)}`: {_safe_reason(exc, url)}")
        st.stop()
    if not ready:
        st.info(
            f"The database `{redact_url(url)}` has no slotsweep tables yet. "
            "Start a search with `slotsweep run CONFIG` and this page fills in."
        )
        st.stop()
    return eng


def _safe_reason(exc: sqlalchemy.exc.SQLAlchemyError, url: str) -> str:
    """The driver's first line of complaint, with the URL's password masked if it is echoed."""
    original = getattr(exc, "orig", None) or exc
    reason = (str(original).strip().splitlines() or [type(original).__name__])[0]
    password = make_url(url).password
    return reason.replace(str(password), "***") if password else reason


def refresh_seconds() -> float | None:
    """The auto-refresh interval chosen in the sidebar (``None``: off)."""
    choice = st.session_state.get("refresh", DEFAULT_REFRESH)
    return REFRESH_CHOICES.get(choice, REFRESH_CHOICES[DEFAULT_REFRESH])


def live(body: Callable[[], None]) -> None:
    """Run ``body`` as a fragment that re-runs itself at the chosen interval.

    Only the fragment re-renders, so the rest of the page (and any widget the user
    is editing outside it) stays put while a search runs.
    """
    st.fragment(run_every=refresh_seconds())(body)()


def sidebar() -> None:
    """The database (password masked) and the refresh interval, on every page."""
    with st.sidebar:
        st.caption(f"Database: `{redact_url(db_url())}`")
        st.selectbox(
            "Auto-refresh",
            list(REFRESH_CHOICES),
            index=list(REFRESH_CHOICES).index(DEFAULT_REFRESH),
            key="refresh",
            help="How often live sections re-read the database.",
        )


def query_int(name: str) -> int | None:
    """An integer query parameter (``?trial=12``), ``None`` when absent or not a number."""
    raw = st.query_params.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def link(page_url_path: str, **params: int) -> str:
    """A relative link to another page, for link columns in tables."""
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{page_url_path}?{query}" if query else page_url_path


def pager(total: int, key: str, page_size: int = PAGE_SIZE) -> int:
    """A page picker under a table; returns the SQL offset of the chosen page."""
    pages = max(1, -(-total // page_size))
    if pages == 1:
        return 0
    page = int(
        st.number_input(
            f"Page (of {pages})", min_value=1, max_value=pages, value=1, step=1, key=key
        )
    )
    return (page - 1) * page_size


def rows_caption(offset: int, shown: int, total: int) -> str:
    if total == 0:
        return "No rows."
    return f"Rows {offset + 1}–{offset + shown} of {total}."


def age(moment: _dt.datetime | None) -> str:
    """'12 s ago' for a naive-UTC timestamp from the database."""
    if moment is None:
        return "never"
    now = _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)
    seconds = max(0.0, (now - moment).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def fmt_value(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.6g}"
