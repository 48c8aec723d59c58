"""The pause and kill controls of a non-loopback UI: shown only to pages with its token."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from streamlit.testing.v1 import AppTest

from storage import get_engine
from tests._demo_data import DemoSearch
from tests.ui._pages import RENDER_TIMEOUT_S, PageRenderer, assert_no_exception, texts
from ui import APP_PATH
from ui._actions import TOKEN_ENV_VAR

TOKEN = "t0ken-for-this-test-only-0123456789"


@pytest.fixture
def token_configured(monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's environment as ``slotsweep ui --host 0.0.0.0`` sets it."""
    monkeypatch.setenv(TOKEN_ENV_VAR, TOKEN)
    return TOKEN


def _requested_action(url: str, experiment_id: int) -> str | None:
    with get_engine(url).connect() as conn:
        return conn.execute(
            sa.text("SELECT requested_action FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment_id},
        ).scalar_one()


def _has_controls(app: AppTest) -> bool:
    return any(button.label == "Send request" for button in app.button)


@pytest.mark.parametrize("given", [None, "", "wrong", TOKEN[:-1], TOKEN + "x"])
def test_controls_are_hidden_without_the_right_token(
    render: PageRenderer,
    writable_synthetic: DemoSearch,
    token_configured: str,
    given: str | None,
) -> None:
    query: dict[str, Any] = {"experiment": writable_synthetic.experiment_id}
    if given is not None:
        query["token"] = given
    app = render("experiment", writable_synthetic.url, **query)
    assert_no_exception(app)
    assert not _has_controls(app)
    assert not app.radio and not app.checkbox
    assert "Pause, kill and resume are hidden" in texts(app)


def _opened(url: str, monkeypatch: pytest.MonkeyPatch, **query: str) -> AppTest:
    """The app after its first run, as a browser opening ``/?token=...`` sees it."""
    monkeypatch.setenv("SLOTSWEEP_DB", url)
    app = AppTest.from_file(str(APP_PATH), default_timeout=RENDER_TIMEOUT_S)
    app.query_params.update(query)
    return app.run()


@pytest.mark.parametrize(("given", "read_only"), [(None, True), ("wrong", True), (TOKEN, False)])
def test_sidebar_says_when_the_page_is_read_only(
    synthetic_search: DemoSearch,
    token_configured: str,
    monkeypatch: pytest.MonkeyPatch,
    given: str | None,
    read_only: bool,
) -> None:
    # Only the first run is looked at: this Streamlit's AppTest drops sidebar elements
    # from reruns of an st.navigation app (see test_pages.py).
    query = {} if given is None else {"token": given}
    app = _opened(synthetic_search.url, monkeypatch, **query)
    assert_no_exception(app)
    captions = "\n".join(str(c.value) for c in app.sidebar.caption)
    assert ("Read-only: pause and kill need the address" in captions) is read_only, captions


def test_controls_work_with_the_token_and_stay_for_the_session(
    writable_synthetic: DemoSearch, token_configured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Open the address `slotsweep ui` printed: the default page, with the token.
    app = _opened(writable_synthetic.url, monkeypatch, token=TOKEN)
    assert_no_exception(app)
    # Links open new sessions, so they carry the token on.
    links = list(app.dataframe[0].value["open"])
    assert links and all(link.endswith(f"&token={TOKEN}") for link in links), links

    # Switching pages drops the query string; the session keeps the token it showed.
    experiment = writable_synthetic.experiment_id
    app.query_params.clear()
    app.switch_page("views/experiment.py")
    app.query_params["experiment"] = str(experiment)
    app.run()
    assert_no_exception(app)
    assert _has_controls(app)
    assert "Pause, kill and resume are hidden" not in texts(app)
    app.radio(key=f"action_{experiment}").set_value("pause").run()
    app.checkbox(key=f"action_confirmed_{experiment}").check().run()
    next(b for b in app.button if b.label == "Send request").click().run()
    assert_no_exception(app)
    assert "Requested pause of experiment" in texts(app)
    assert _requested_action(writable_synthetic.url, experiment) == "pause"


def test_without_a_configured_token_controls_show_and_links_carry_none(
    render: PageRenderer, writable_synthetic: DemoSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loopback server: what `slotsweep ui` on 127.0.0.1 starts (no token in the env).
    monkeypatch.delenv(TOKEN_ENV_VAR, raising=False)
    app = render("experiment", writable_synthetic.url, experiment=writable_synthetic.experiment_id)
    assert_no_exception(app)
    assert _has_controls(app)
    app.switch_page("views/experiments.py").run()
    assert not any("token" in link for link in app.dataframe[0].value["open"])
