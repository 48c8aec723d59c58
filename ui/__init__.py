"""slotsweep's web UI: a Streamlit app that shows what a search recorded.

Pages: Experiments, Experiment (learning curves of every trial, Optuna's plots of the
study), Trial (metrics, checkpoints, restarts, log, profile, system metrics), Compare
(2-5 trials or experiments side by side) and Cluster (a grid of slots and who holds
them). The app only reads the database, through a read-only engine and the read model
the CLI and the API share (:mod:`trials.queries`): what is here is display; the one
write it can make is an explicitly confirmed pause or kill request.

Serving it is one call, which runs until the server stops (so no example runs it
here; tests/ui starts the server and a browser)::

    import ui
    ui.launch("sqlite:///slotsweep.db", port=8501)
"""

from ui._launch import APP_PATH, launch, streamlit_command

__all__ = ["APP_PATH", "launch", "streamlit_command"]
