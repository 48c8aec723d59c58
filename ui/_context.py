"""What every page shares: the database, the refresh interval, links, paging, controls.

The app learns its database from ``$SLOTSWEEP_DB`` (which is how :func:`ui.launch`
passes it: a command line is visible to every user through ``ps``), else it uses the
default SQLite file. All reads go through a read-only engine: deferred transactions
that never take SQLite's write lock, so the UI cannot make the driver or a trial fail
with "database is locked". Whether this browser session may pause or kill is decided
here too (:func:`controls_allowed`; see :mod:`ui._actions` for the token scheme).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from pathlib import Path

import sqlalchemy.exc
import streamlit as st
from sqlalchemy.engine import Engine, make_url

from storage import get_engine, redact_secrets, redact_url, resolve_db_url
from trials.labels import parse_trial_label, trial_label
from ui._actions import TOKEN_ENV_VAR, TOKEN_QUERY_PARAM, token_accepted
from ui._units import duration_words

EXPERIMENTS_PAGE = "views/experiments.py"
EXPERIMENT_PAGE = "views/experiment.py"
TRIAL_PAGE = "views/trial.py"
CLUSTER_PAGE = "views/cluster.py"
COMPARE_PAGE = "views/compare.py"
DIAGNOSIS_PAGE = "views/diagnosis.py"
# The Compare page overlays 2 to this many trials or experiments; more is unreadable.
MAX_COMPARED = 5

REFRESH_CHOICES: dict[str, float | None] = {
    "off": None,
    "2 s": 2.0,
    "5 s": 5.0,
    "10 s": 10.0,
    "30 s": 30.0,
}
DEFAULT_REFRESH = "5 s"
PAGE_SIZE = 50


# Where a session that presented the right token keeps it: page switches drop the
# query string, and links opened in a new tab must carry the token on.
_TOKEN_STATE_KEY = "_slotsweep_control_token"


def db_url() -> str:
    """The database URL from ``$SLOTSWEEP_DB``, else the default SQLite file."""
    return resolve_db_url()


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
    from trials import queries

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
        ready = queries.has_schema(eng)
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
    """The driver's first line of complaint, with the URL's secrets masked if it echoes them."""
    original = getattr(exc, "orig", None) or exc
    reason = (str(original).strip().splitlines() or [type(original).__name__])[0]
    return redact_secrets(reason, url)


def controls_allowed() -> bool:
    """Whether this browser session may pause or kill experiments.

    Without a configured token (a loopback server) it may. Otherwise the page must
    have been opened with ``?token=`` matching :data:`ui._actions.TOKEN_ENV_VAR`; a
    match is remembered for the session, since switching pages drops the query string.
    """
    expected = os.environ.get(TOKEN_ENV_VAR) or None
    if expected is None:
        return True
    remembered = st.session_state.get(_TOKEN_STATE_KEY)
    if token_accepted(expected, remembered):
        return True
    given = st.query_params.get(TOKEN_QUERY_PARAM)
    if not token_accepted(expected, given):
        return False
    st.session_state[_TOKEN_STATE_KEY] = given
    return True


def _carried_token() -> str | None:
    """The token to put in links this session makes, if a token is configured and known."""
    if not os.environ.get(TOKEN_ENV_VAR) or not controls_allowed():
        return None
    token = st.session_state.get(_TOKEN_STATE_KEY)
    return str(token) if token else None


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
    """The database (secrets masked), the refresh interval and the control access."""
    with st.sidebar:
        st.caption(f"Database: `{redact_url(db_url())}`")
        # Checked on every page, so the token of the first page opened is remembered.
        if not controls_allowed():
            st.caption(
                "Read-only: pause and kill need the address `slotsweep ui` printed "
                f"(it ends in `?{TOKEN_QUERY_PARAM}=…`)."
            )
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


def link(page_url_path: str, **params: int | str) -> str:
    """A relative link to another page, for link columns in tables.

    Such links open a new browser session, so they carry this session's control token.
    """
    pairs = [f"{key}={value}" for key, value in params.items()]
    token = _carried_token()
    if token is not None:
        pairs.append(f"{TOKEN_QUERY_PARAM}={token}")
    query = "&".join(pairs)
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
    return f"{duration_words((now - moment).total_seconds())} ago"


def trial_ref(experiment_id: int, number: int) -> str:
    """A trial in URLs: ``EXPERIMENT.NUMBER``, the Optuna trial number as in the logs.

    Example:
        >>> trial_ref(3, 13)
        '3.13'
    """
    return trial_label(experiment_id, number)


def parse_trial_ref(text: str | None) -> tuple[int, int] | int | None:
    """``'3.13'`` -> ``(3, 13)``; a bare ``'14'`` -> ``14``, a database id from an old link.

    Old links (``?trial=14``) name the database id; pages look it up and rewrite the
    address with the trial's ``EXPERIMENT.NUMBER``. Anything else is ``None``.

    Example:
        >>> parse_trial_ref("3.13"), parse_trial_ref("14"), parse_trial_ref("x"), parse_trial_ref(None)
        ((3, 13), 14, None, None)
    """
    raw = (text or "").strip()
    parsed = parse_trial_label(raw)
    if parsed is not None and parsed[0] is not None:
        return parsed[0], parsed[1]
    # Not a label: what an old link held, a database id (``#3`` needs its experiment).
    return int(raw) if raw.isdecimal() else None
