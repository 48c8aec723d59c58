"""The app's pages, run by ``st.navigation`` from ``ui/app.py``.

Not named ``pages/``: Streamlit treats a ``pages/`` folder beside the main script as
its older multipage layout and, on a fresh server, runs a page opened by its direct
URL without ``app.py`` (no sidebar controls, a stray "app" entry in the page list).
"""
