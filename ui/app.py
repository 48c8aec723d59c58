"""The Streamlit entry point: ``SLOTSWEEP_DB=URL streamlit run ui/app.py`` (see ``ui.launch``).

The URL comes through the environment, never the command line, which ``ps`` shows to
every user of the machine.
"""

from __future__ import annotations

import streamlit as st

from ui import _context

st.set_page_config(page_title="slotsweep", layout="wide")
# Streamlit pads the page by 5rem a side: at 1024 px, beside the sidebar, that left a
# table 550 px and pushed its key columns off-screen.
st.html(
    "<style>[data-testid='stMainBlockContainer']"
    "{padding-left: 1rem; padding-right: 1rem; padding-top: 2.5rem}</style>"
)


def _home() -> None:
    # "/" opens the Experiments page at its own address, "/experiments": a default page
    # is served at "/" only, and "/experiments" (what a user types after seeing the
    # sidebar) answered "Page not found".
    st.switch_page(_context.EXPERIMENTS_PAGE)


navigation = st.navigation(
    [
        st.Page(_home, title="Home", default=True, visibility="hidden"),
        st.Page(_context.EXPERIMENTS_PAGE, title="Experiments", url_path="experiments"),
        st.Page(_context.EXPERIMENT_PAGE, title="Experiment", url_path="experiment"),
        st.Page(_context.TRIAL_PAGE, title="Trial", url_path="trial"),
        st.Page(_context.COMPARE_PAGE, title="Compare", url_path="compare"),
        st.Page(_context.CLUSTER_PAGE, title="Cluster", url_path="cluster"),
        st.Page(_context.DIAGNOSIS_PAGE, title="Diagnosis", url_path="diagnosis"),
    ]
)
_context.sidebar()
navigation.run()
