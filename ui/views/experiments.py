"""Experiments: every search with its state, progress, best value and slots in use."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from storage import ExperimentState
from trials import queries
from ui import _context, _format

st.title("Experiments")
engine = _context.require_database()

filters = st.columns([2, 3])
states = filters[0].multiselect(
    "State", [s.value for s in ExperimentState], key="experiments_states"
)
name = filters[1].text_input("Name contains", key="experiments_name")


def _table() -> None:
    total = queries.list_experiments(engine, states=states, name_contains=name, limit=1).total
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
    page = queries.list_experiments(
        engine, states=states, name_contains=name, limit=_context.PAGE_SIZE, offset=offset
    )
    rows = page.rows.assign(
        open=[_context.link("experiment", experiment=int(i)) for i in page.rows["id"]]
    )
    # No row selection: its checkbox column cost the width of "failed" at 1024 px, and
    # the "open" link opens the experiment (in a new tab too).
    st.dataframe(
        # The state's colour on its cell and the progress bar's: a failed search's bar
        # must not look like a running one's.
        rows.style.apply(_state_colours, axis=1),
        hide_index=True,
        width="stretch",
        key="experiments_table",
        # What a user scans for first, so it fits at 1024 px: which search, how far,
        # how good, how many pruned or failed. The rest (running, queued, slots, start
        # and end, id) is on the Experiment page.
        column_order=[
            "open",
            "name",
            "state",
            "progress",
            "done",
            "best",
            "pruned",
            "failed",
        ],
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open ↗", width="small"),
            "progress": st.column_config.ProgressColumn(
                "progress",
                min_value=0.0,
                max_value=1.0,
                format="percent",
                width="small",
                color="gray",  # The state's tint colours the cell; red meant nothing.
            ),
            "done": st.column_config.TextColumn(
                "done/max", help="finished trials of max_trials", width="small"
            ),
            "pruned": st.column_config.NumberColumn("pruned", width="small"),
            "failed": st.column_config.NumberColumn(
                "failed", help="trials in state ERROR", width="small"
            ),
            "running": st.column_config.NumberColumn("running", width="small"),
            "best": st.column_config.NumberColumn(
                "best", format=_format.COLUMN, help="best searcher metric", width="small"
            ),
            "slots_in_use": st.column_config.NumberColumn("slots", width="small"),
            "started": st.column_config.DatetimeColumn("started (UTC)", format="MM-DD HH:mm"),
        },
    )
    st.caption(
        _context.rows_caption(page.offset, len(rows), page.total)
        + " Follow 'open' to see the experiment."
    )


# Light tints (dark text stays readable) of the trial-state colours of the charts.
STATE_TINTS = {
    "COMPLETED": "#d6e4f0",
    "ACTIVE": "#dcefd9",
    "PAUSED": "#fde6c8",
    "ERROR": "#f8d4d3",
    "CANCELED": "#e4e4e4",
}


def _state_colours(row: pd.Series) -> list[str]:
    """The CSS of one row: its state and progress cells tinted by the state."""
    tint = STATE_TINTS.get(str(row["state"]), "")
    return [
        f"background-color: {tint}" if tint and column in ("state", "progress") else ""
        for column in row.index
    ]


_context.live(_table)
