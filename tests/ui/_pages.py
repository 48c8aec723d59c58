"""Rendering the real app's pages through AppTest, and reading what they show."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from ui import APP_PATH

PAGES = {
    "experiments": "views/experiments.py",
    "experiment": "views/experiment.py",
    "trial": "views/trial.py",
    "compare": "views/compare.py",
    "cluster": "views/cluster.py",
    "diagnosis": "views/diagnosis.py",
}
# The first render of a page imports plotly/optuna/pandas; CI machines are slow.
RENDER_TIMEOUT_S = 60.0


class PageRenderer:
    """Renders one page of the real app through AppTest against a chosen database."""

    _components: Any = None

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def __call__(self, page: str, url: str, run: bool = True, **query: Any) -> AppTest:
        self._monkeypatch.setenv("SLOTSWEEP_DB", url)
        app = AppTest.from_file(str(APP_PATH), default_timeout=RENDER_TIMEOUT_S)
        # Each AppTest scans every installed package for Streamlit components (~0.5 s);
        # the result never changes within a test session, so it is shared.
        if PageRenderer._components is not None:
            app._bidi_component_manager = PageRenderer._components
        app.run()
        PageRenderer._components = getattr(app, "_bidi_component_manager", None)
        app.switch_page(PAGES[page])
        for key, value in query.items():
            app.query_params[key] = str(value)
        return app.run() if run else app


def texts(app: AppTest) -> str:
    """Every text the page shows (titles, headers, markdown, messages, captions, metrics)."""
    parts: list[str] = []
    for group in (
        app.title,
        app.header,
        app.subheader,
        app.markdown,
        app.caption,
        app.info,
        app.warning,
        app.error,
        app.success,
        app.code,
    ):
        parts.extend(str(element.value) for element in group)
    parts.extend(f"{m.label}: {m.value}" for m in app.metric)
    return "\n".join(parts)


def assert_no_exception(app: AppTest) -> None:
    assert not app.exception, [e.value for e in app.exception]


def vega_charts(app: AppTest) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Every Vega-Lite chart on the page: its spec and the rows it was given."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df

    charts = []
    for chart in app.get("vega_lite_chart"):
        proto: Any = chart.proto
        data = proto.data.data
        frame = convert_arrow_bytes_to_pandas_df(data) if data else pd.DataFrame()
        charts.append((json.loads(proto.spec), frame))
    return charts
