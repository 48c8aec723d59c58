"""Diagnosis: what ``slotsweep diagnose`` measured for a configuration, and its verdict.

``?diagnosis=ID`` opens one (the newest otherwise): the verdict in words, the probe
table, the shares with their spread over windows, a configured step split into compute,
communication and input, the bucket sweep, and the settings to try with their gains.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from trials import queries
from ui import _context, _diagnosis, _format

st.title("Diagnosis")
engine = _context.require_database()

choices = queries.diagnosis_choices(engine)
if choices.empty:
    st.info(
        "No diagnosis yet. Run `slotsweep diagnose CONFIG` (the Trial page shows the "
        "command for a trial's configuration)."
    )
    st.stop()

ids = [int(i) for i in choices["id"]]
labels = {
    int(row.id): f"#{row.id} {row.name}: {row.verdict} ({row.created_at:%Y-%m-%d %H:%M} UTC)"
    for row in choices.itertuples()
}
requested = _context.query_int("diagnosis")
if requested is not None and requested not in labels:
    found = queries.diagnosis_report(engine, requested)
    if found is None:
        st.warning(f"Diagnosis {requested} does not exist; showing the newest.")
        requested = None
    else:
        ids.insert(0, requested)
        labels[requested] = f"#{requested} {found['name']}: {found['verdict']}"
picked = st.selectbox(
    "Diagnosis",
    ids,
    index=ids.index(requested) if requested is not None else 0,
    format_func=labels.__getitem__,
)
if picked != requested:
    st.query_params["diagnosis"] = str(picked)
row = queries.diagnosis_report(engine, int(picked))
if row is None:  # Deleted between the two reads.
    st.stop()
report: dict[str, Any] = row["report"]

st.subheader(f"{row['name']}: {row['verdict']}")
where = (
    f"experiment #{row['experiment_id']}"
    if row["experiment_id"] is not None
    else "no experiment of this name yet"
)
st.caption(f"{row['config_path'] or 'config path unknown'} · {where} · {report['slots']} slot(s)")
top = st.columns(3)
top[0].metric("Communication share", _diagnosis.share_text(report.get("communication_share")))
top[1].metric("Input share", _diagnosis.share_text(report.get("input_share")))
top[2].metric("Weak-scaling efficiency", _diagnosis.share_text(report.get("scaling_efficiency")))
if report.get("agent_efficiency") is not None:
    st.caption(f"Several agents against one: {_diagnosis.share_text(report['agent_efficiency'])}")

st.markdown("#### Settings to try")
if not report.get("suggestions"):
    st.success("Nothing to change: the probes found no bottleneck worth a setting.")
for tip in report.get("suggestions", []):
    gain = (
        "gain not measured" if tip["gain"] is None else f"measured {_format.number(tip['gain'])}x"
    )
    st.markdown(f"- `{tip['setting']}` ({gain}): {tip['why']}")

st.markdown("#### Probes")
table = _diagnosis.probe_table(report)
st.dataframe(
    table,
    hide_index=True,
    width="stretch",
    column_config={
        "samples_per_s": st.column_config.NumberColumn("samples/s", format=_format.COLUMN),
        "samples_per_s_low": st.column_config.NumberColumn("low", format=_format.COLUMN),
        "samples_per_s_high": st.column_config.NumberColumn("high", format=_format.COLUMN),
        "step_ms": st.column_config.NumberColumn("step (ms)", format=_format.COLUMN),
        "input_ms": st.column_config.NumberColumn("input (ms)", format=_format.COLUMN),
        "train_batch_ms": st.column_config.NumberColumn("train_batch (ms)", format=_format.COLUMN),
    },
)
st.caption(
    "Medians over windows of batches (the first window left out as warm-up); low and "
    "high are the slowest and fastest windows."
)

st.markdown("#### Where a configured step goes")
split = _diagnosis.step_split_frame(report)
st.vega_lite_chart(
    split,
    {
        "mark": {"type": "bar"},
        "encoding": {
            "y": {"field": "step", "type": "nominal", "title": None},
            "x": {
                "field": "ms",
                "type": "quantitative",
                "stack": "zero",
                "title": "milliseconds per batch",
                "axis": {"format": _format.D3},
            },
            "color": {
                "field": "part",
                "type": "nominal",
                "sort": list(_diagnosis.STEP_PARTS),
                "title": None,
            },
            "tooltip": [
                {"field": "part", "type": "nominal"},
                {"field": "ms", "type": "quantitative", "format": _format.D3},
            ],
        },
    },
    height=120,
    width="stretch",
)

exchange = report.get("exchange")
if exchange is not None:
    st.markdown("#### Gradient exchange")
    cols = st.columns(3)
    cols[0].metric("Parameters", f"{exchange['parameters']:,}")
    cols[1].metric("Gradient MB per step", _format.number(exchange["gradient_bytes"] / 1e6))
    cols[2].metric("All-reduce MB/s", _format.number(exchange["allreduce_bytes_per_s"] / 1e6))
    st.caption(
        f"Bucket sweep over {exchange['world_size']} ranks: best "
        f"{_format.number(exchange['best_bucket_mb'])} MB, configured "
        f"{_format.number(exchange['configured_bucket_mb'])} MB."
    )
    st.dataframe(
        _diagnosis.sweep_frame(report),
        hide_index=True,
        column_config={
            "bucket_mb": st.column_config.NumberColumn("bucket (MB)", format=_format.COLUMN),
            "exchange_ms": st.column_config.NumberColumn("exchange (ms)", format=_format.COLUMN),
        },
    )
