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

from collections.abc import Sequence
from typing import Any, Literal

from ui import _format

FieldType = Literal["quantitative", "temporal"]


def line_spec(
    *,
    x: str,
    y: str,
    x_title: str,
    y_title: str,
    color: str | None = None,
    x_type: FieldType = "quantitative",
    y_format: str | None = None,
) -> dict[str, Any]:
    """A line chart of ``y`` over ``x``, one line per ``color`` value when given.

    A temporal ``x`` reads as UTC clock times (``14:02:10``), never as Vega's default
    sub-second labels (``.900``); ``y_format`` is a d3 format for the y axis.
    """
    x_enc: dict[str, Any] = {"field": x, "type": x_type, "title": x_title}
    x_tip: dict[str, Any] = {"field": x, "type": x_type, "title": x_title}
    if x_type == "temporal":
        x_enc["scale"] = {"type": "utc"}
        # Ticks at least a second apart, so labels never fall back to milliseconds.
        x_enc["axis"] = {"format": "%H:%M:%S", "tickMinStep": 1000, "labelOverlap": True}
        x_tip.update(format="%Y-%m-%d %H:%M:%S", scale={"type": "utc"})
    y_enc: dict[str, Any] = {
        "field": y,
        "type": "quantitative",
        "title": y_title,
        "scale": {"zero": False},
    }
    if y_format is not None:
        y_enc["axis"] = {"format": y_format}
    encoding: dict[str, Any] = {
        "x": x_enc,
        "y": y_enc,
        "tooltip": [
            x_tip,
            {
                "field": y,
                "type": "quantitative",
                "title": y_title,
                "format": y_format or _format.D3,
            },
        ],
    }
    if color is not None:
        encoding["color"] = {"field": color, "type": "nominal", "title": None}
        encoding["tooltip"].insert(0, {"field": color, "type": "nominal"})
    return {"mark": {"type": "line", "point": False, "tooltip": True}, "encoding": encoding}


# Categorical colours of trial states (Tableau 10, readable on white and by most
# colour-blind users); the best trial is drawn black on top of them. PRUNED is purple,
# far from ERROR's red: a pruned trial is the search working, not a failure.
STATE_COLORS = {
    "COMPLETED": "#4c78a8",
    "PRUNED": "#b279a2",
    "ERROR": "#e45756",
    "RUNNING": "#54a24b",
    "QUEUED": "#79706e",
    "NOT_RUN": "#bab0ac",
}
# Where ASHA stopped a trial: a darker shade of PRUNED's purple.
STOPPED_COLOR = "#6b3d8f"
# Under ASHA most trials stop at the first rung: drawn faint, the few that go on show.
PRUNED_OPACITY = 0.3
PICK = "pick"


def learning_curve_spec(
    *,
    x: str,
    x_title: str,
    y_title: str,
    rungs: list[float],
    selectable: bool = True,
    states: Sequence[str] = (),
    log_y: bool = False,
    integer_x: bool = True,
) -> dict[str, Any]:
    """Every trial's curve in one chart (Determined's learning-curve view).

    Expects rows with ``number``, ``state``, ``value``, ``best``, ``stopped``,
    ``hparams`` (text for the tooltip) and the ``x`` field. Lines are coloured by trial
    state (the legend lists ``states``, those present; every state when empty); pruned
    trials are faint, so the many stopped at one rung do not hide the rest; the best
    trial is thick and black; a pruned trial's last point is a cross where ASHA stopped
    it; ``rungs`` are dashed vertical rules. ``log_y`` draws the metric on a log scale
    (good curves are not squeezed into the bottom tenth by a few bad ones);
    ``integer_x`` ticks whole epochs or batches. With ``selectable``, clicking curves
    (shift for more) selects trials through the :data:`PICK` selection.
    """
    shown = [s for s in STATE_COLORS if not states or s in states]
    tooltip = [
        {"field": "number", "type": "ordinal", "title": "trial"},
        {"field": "state", "type": "nominal"},
        {"field": x, "type": "quantitative", "title": x_title, "format": _format.D3},
        {"field": "value", "type": "quantitative", "title": y_title, "format": _format.D3},
        {"field": "hparams", "type": "nominal", "title": "hyperparameters"},
    ]
    x_enc, y_enc = _curve_axes(x, x_title, y_title, log_y=log_y, integer_x=integer_x)
    faint = {"test": "datum.state === 'PRUNED'", "value": PRUNED_OPACITY}
    lines: dict[str, Any] = {
        "mark": {"type": "line", "strokeWidth": 1.5, "point": {"size": 18}},
        "encoding": {
            "x": x_enc,
            "y": y_enc,
            "detail": {"field": "number", "type": "nominal"},
            "color": {
                "field": "state",
                "type": "nominal",
                "title": "trial state",
                "scale": {"domain": shown, "range": [STATE_COLORS[s] for s in shown]},
            },
            "opacity": {"condition": faint, "value": 0.6},
            "tooltip": tooltip,
        },
    }
    if selectable:
        _pick_on_click(lines, faint)
    best = {
        "transform": [{"filter": "datum.best"}],
        "mark": {"type": "line", "color": "#111111", "strokeWidth": 3.5, "point": True},
        "encoding": {"x": x_enc, "y": y_enc, "tooltip": tooltip},
    }
    stopped = {
        "transform": [{"filter": "datum.stopped"}],
        "mark": {
            "type": "point",
            "shape": "cross",
            "size": 140,
            "filled": True,
            "color": STOPPED_COLOR,
            "opacity": 0.5,
        },
        "encoding": {"x": x_enc, "y": y_enc, "tooltip": tooltip},
    }
    layers: list[dict[str, Any]] = [lines, best, stopped]
    if rungs:
        layers.insert(0, _rung_rules(rungs, x_title))
    return {"layer": layers}


def _curve_axes(
    x: str, x_title: str, y_title: str, *, log_y: bool, integer_x: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The learning curves' x and y encodings (whole-number ticks, a log or free y scale)."""
    x_enc: dict[str, Any] = {"field": x, "type": "quantitative", "title": x_title}
    if integer_x:
        x_enc["axis"] = {"tickMinStep": 1, "format": "d"}
    y_enc = {
        "field": "value",
        "type": "quantitative",
        "title": y_title + (" (log scale)" if log_y else ""),
        "scale": {"type": "log"} if log_y else {"zero": False},
        "axis": {"format": _format.D3},
    }
    return x_enc, y_enc


def _pick_on_click(lines: dict[str, Any], faint: dict[str, Any]) -> None:
    """Let clicks on ``lines`` select trials (:data:`PICK`), drawn opaque and thick."""
    lines["params"] = [
        {"name": PICK, "select": {"type": "point", "fields": ["number"], "on": "click"}}
    ]
    lines["encoding"]["opacity"] = {
        "condition": [{"param": PICK, "empty": False, "value": 1.0}, faint],
        "value": 0.6,
    }
    lines["encoding"]["strokeWidth"] = {
        "condition": {"param": PICK, "empty": False, "value": 3.5},
        "value": 1.5,
    }


def _rung_rules(rungs: list[float], x_title: str) -> dict[str, Any]:
    """ASHA's rungs as dashed vertical rules, named in their tooltip."""
    return {
        "data": {"values": [{"rung": r} for r in rungs]},
        "mark": {"type": "rule", "strokeDash": [6, 4], "color": "#555555"},
        "encoding": {
            "x": {"field": "rung", "type": "quantitative"},
            "tooltip": [{"field": "rung", "title": f"ASHA rung ({x_title})"}],
        },
    }


# Holders of slots take these in turn; a free slot is light grey with a dark label.
_HOLDER_PALETTE = [
    "#4c78a8",
    "#f58518",
    "#54a24b",
    "#b279a2",
    "#e45756",
    "#72b7b2",
    "#9d755d",
    "#eeca3b",
    "#ff9da6",
    "#bab0ac",
]
# Idle or ending warm jobs hold slots and train nothing: muted slate tones, apart from
# the trials' colours, still dark enough for a white label.
_IDLE_WARM_PALETTE = ["#5f6b7a", "#7a6a5f", "#56675a", "#6d5f7a"]
# The outline of every slot a warm job holds (running a trial or idle).
_WARM_STROKE = "#222222"
FREE = "free"
# One agent's row of slot cells, and one row of the legend under the grid.
SLOT_ROW_PX = 36
LEGEND_ROW_PX = 20


def slot_grid_height(spec: dict[str, Any]) -> int:
    """The pixel height a :func:`slot_grid_spec` chart needs: its rows, axes and legend.

    Example:
        >>> slot_grid_height(slot_grid_spec(["1.0", "1.1"], 2))
        172
    """
    legend = spec["layer"][0]["encoding"]["color"]["scale"]["domain"]
    legend_rows = -(-len(legend) // 2)  # two columns
    return int(spec["height"]) + 60 + LEGEND_ROW_PX * legend_rows


def slot_grid_spec(
    holders: list[str], n_agents: int, *, idle_warm_jobs: Sequence[str] = ()
) -> dict[str, Any]:
    """Agents as rows of slot cells, each coloured by the trial holding it (or free).

    Expects rows with ``agent``, ``slot``, ``holder`` (a trial label, one of
    ``idle_warm_jobs`` or :data:`FREE`) and ``label`` (the text inside the cell); an
    optional ``warm_job`` (``""`` for none) outlines a warm job's slots and names the
    job in the tooltip. Each idle warm job has its own legend entry and a muted colour.
    """
    domain = [FREE, *holders, *idle_warm_jobs]
    colors = [
        "#e6e6e6",
        *(_HOLDER_PALETTE[i % len(_HOLDER_PALETTE)] for i in range(len(holders))),
        *(_IDLE_WARM_PALETTE[i % len(_IDLE_WARM_PALETTE)] for i in range(len(idle_warm_jobs))),
    ]
    axis = {"labelAngle": 0, "title": None}
    encoding = {
        "x": {"field": "slot", "type": "ordinal", "title": "slot", "axis": axis},
        "y": {"field": "agent", "type": "nominal", "axis": axis},
    }
    warm = "datum.warm_job && datum.warm_job !== ''"
    return {
        "height": max(SLOT_ROW_PX, SLOT_ROW_PX * n_agents),
        # Below the grid, so long holder names never push the grid narrow or get cut.
        "config": {"legend": {"orient": "bottom", "columns": 2, "labelLimit": 400}},
        "layer": [
            {
                "mark": {"type": "rect", "stroke": "white", "strokeWidth": 2},
                "encoding": {
                    **encoding,
                    "color": {
                        "field": "holder",
                        "type": "nominal",
                        "title": "held by",
                        "scale": {"domain": domain, "range": colors},
                    },
                    "stroke": {
                        "condition": {"test": warm, "value": _WARM_STROKE},
                        "value": "white",
                    },
                    "strokeDash": {"condition": {"test": warm, "value": [4, 2]}, "value": [1, 0]},
                    "tooltip": [
                        {"field": "agent"},
                        {"field": "slot"},
                        {"field": "holder", "title": "held by"},
                        {"field": "warm_job", "title": "warm job"},
                    ],
                },
            },
            {
                "mark": {"type": "text", "fontSize": 11},
                "encoding": {
                    **encoding,
                    "text": {"field": "label"},
                    "color": {
                        "condition": {"test": f"datum.holder === '{FREE}'", "value": "#333333"},
                        "value": "white",
                    },
                },
            },
        ],
    }
