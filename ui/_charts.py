"""Vega-Lite specs for the line charts of the Trial page.

``st.line_chart`` builds its chart through Altair, about 0.1-0.3 s per chart on a
2-core machine; a Trial page draws half a dozen. A plain Vega-Lite spec renders the
same chart in a few milliseconds.

Example:
    >>> spec = line_spec(x="step", y="value", x_title="batch", y_title="loss")
    >>> spec["mark"]["type"], spec["encoding"]["x"]["field"]
    ('line', 'step')
"""

from __future__ import annotations

from typing import Any, Literal

FieldType = Literal["quantitative", "temporal"]


def line_spec(
    *,
    x: str,
    y: str,
    x_title: str,
    y_title: str,
    color: str | None = None,
    x_type: FieldType = "quantitative",
) -> dict[str, Any]:
    """A line chart of ``y`` over ``x``, one line per ``color`` value when given."""
    encoding: dict[str, Any] = {
        "x": {"field": x, "type": x_type, "title": x_title},
        "y": {"field": y, "type": "quantitative", "title": y_title, "scale": {"zero": False}},
        "tooltip": [
            {"field": x, "type": x_type, "title": x_title},
            {"field": y, "type": "quantitative", "title": y_title, "format": ".6g"},
        ],
    }
    if color is not None:
        encoding["color"] = {"field": color, "type": "nominal", "title": None}
        encoding["tooltip"].insert(0, {"field": color, "type": "nominal"})
    return {"mark": {"type": "line", "point": False, "tooltip": True}, "encoding": encoding}
