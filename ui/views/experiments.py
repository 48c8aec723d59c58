"""Experiments: every search with its state, progress, best value and slots in use."""

from __future__ import annotations

import streamlit as st

from storage import ExperimentState
from ui import _context, _format, _queries

st.title("Experiments")
engine = _context.require_database()

filters = st.columns([2, 3])
states = filters[0].multiselect(
    "State", [s.value for s in ExperimentState], key="experiments_states"
)
name = filters[1].text_input("Name contains", key="experiments_name")


def _table() -> None:
    total = _queries.list_experiments(engine, states=states, name_contains=name, limit=1).total
    if total == 0:
        if states or name:
            st.info("No experiment matches these filters.")
        else:
            st.info(
                "No experiments yet. Start one with `slotsweep run CONFIG`; "
                "it appears here as soon as the driver records it."
            )
        return
    offset = _context.pager(total, key="experiments_page")
    page = _queries.list_experiments(
        engine, states=states, name_contains=name, limit=_context.PAGE_SIZE, offset=offset
    )
    rows = page.rows.assign(
        open=[_context.link("experiment", experiment=int(i)) for i in page.rows["id"]]
    )
    event = st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        on_select="rerun",
        selection_mode="single-row",
        key="experiments_table",
        column_order=[
            "open",
            "id",
            "name",
            "state",
            "progress",
            "done",
            "running",
            "queued",
            "pruned",
            "failed",
            "best",
            "metric",
            "slots_in_use",
            "started",
            "ended",
            "requested_action",
        ],
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open"),
            "progress": st.column_config.ProgressColumn(
                "progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "done": st.column_config.TextColumn("done/max", help="finished trials of max_trials"),
            "failed": st.column_config.NumberColumn("failed", help="trials in state ERROR"),
            "best": st.column_config.NumberColumn("best", format=_format.COLUMN),
            "slots_in_use": st.column_config.NumberColumn("slots in use"),
            "started": st.column_config.DatetimeColumn("started (UTC)"),
            "ended": st.column_config.DatetimeColumn("ended (UTC)"),
        },
    )
    st.caption(
        _context.rows_caption(page.offset, len(rows), page.total)
        + " Select a row (or follow 'open') to see the experiment."
    )
    selected = event.selection.rows if event is not None else []
    if selected:
        experiment_id = int(rows.iloc[selected[0]]["id"])
        st.switch_page(_context.EXPERIMENT_PAGE, query_params={"experiment": str(experiment_id)})


_context.live(_table)
