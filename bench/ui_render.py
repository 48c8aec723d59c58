"""Render time of each UI page on a huge experiment, against a small search in the same run.

Seeds a SQLite database with one experiment of 1,000 trials and 200,000 metric rows
(``ui._demo_data.seed_huge_experiment``) next to a small real search (the baseline),
then renders each page of the real app through ``streamlit.testing.v1.AppTest``:
Experiments, Experiment (the huge experiment, default plot), Trial (a trial of the huge
experiment) and Cluster. Every timed render starts with Streamlit's caches cleared, so
the Experiment page reads the Optuna study from the database each time. The process
is warmed up first (imports, one render of each page), as a running server would be.

Target: every page under 2 s. The last line is machine-readable:
``max_page_s=<x> experiments_s=<a> experiment_s=<b> trial_s=<c> cluster_s=<d>``
(the median of ``--repeats`` cold renders per page).

Usage: ``.venv/bin/python bench/ui_render.py [--repeats 3] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

PAGES = {
    "experiments": "pages/experiments.py",
    "experiment": "pages/experiment.py",
    "trial": "pages/trial.py",
    "cluster": "pages/cluster.py",
}


def _render(url: str, page: str, query: dict[str, int], components: list[Any]) -> float:
    """Seconds for one cold render of ``page`` (the app's first run is not timed)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from ui import APP_PATH

    os.environ["SLOTSWEEP_DB"] = url
    st.cache_resource.clear()
    st.cache_data.clear()
    app = AppTest.from_file(str(APP_PATH), default_timeout=120)
    if components:
        # The installed-components scan is per AppTest object, not per page render.
        app._bidi_component_manager = components[0]
    app.run()
    components[:] = [getattr(app, "_bidi_component_manager", None)]
    app.switch_page(PAGES[page])
    for key, value in query.items():
        app.query_params[key] = str(value)
    start = time.perf_counter()
    app.run()
    elapsed = time.perf_counter() - start
    if app.exception:
        raise RuntimeError(f"{page}: {app.exception[0].value}")
    return elapsed


def _plot_seconds(url: str, experiment_id: int) -> dict[str, float]:
    """The huge study's snapshot and each Optuna plot drawn from it (shown on request)."""
    import sqlalchemy as sa

    from storage import get_engine
    from ui import _plots

    with get_engine(url).connect() as conn:
        study_name = conn.execute(
            sa.text("SELECT study_name FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment_id},
        ).scalar_one()
    start = time.perf_counter()
    study = _plots.snapshot_study(url, study_name)
    seconds = {"snapshot": time.perf_counter() - start}
    _plots.preload_importance_backend()  # A one-time import, started early by the page.
    for kind in _plots.available_plots(len(study.directions)):
        _plots.make_plot(study, kind, ["val_loss"])  # First use of plotly's figure code.
        start = time.perf_counter()
        figure, reason = _plots.make_plot(study, kind, ["val_loss"])
        if figure is None:
            raise RuntimeError(f"{kind}: {reason}")
        figure.to_json()  # What st.plotly_chart sends to the browser.
        seconds[kind] = time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="seed into DIR and keep it")
    args = parser.parse_args()

    import sqlalchemy as sa

    from storage import get_engine, upgrade_schema
    from ui._demo_data import seed_huge_experiment, seed_small_search, write_cluster_file

    root = args.keep or Path(tempfile.mkdtemp(prefix="ui_render_"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["SLOTSWEEP_CLUSTER"] = str(write_cluster_file(root / "cluster.yaml"))

    small_url = f"sqlite:///{root / 'small.db'}"
    upgrade_schema(small_url)
    start = time.perf_counter()
    demo = seed_small_search(small_url, root / "small")
    print(f"seeded the small search (baseline) in {time.perf_counter() - start:.1f} s")

    huge_url = f"sqlite:///{root / 'huge.db'}"
    upgrade_schema(huge_url)
    start = time.perf_counter()
    experiment_id = seed_huge_experiment(huge_url, n_trials=1000, metric_rows=200_000)
    with get_engine(huge_url).connect() as conn:
        trials, metrics = conn.execute(
            sa.text(
                "SELECT (SELECT COUNT(*) FROM slotsweep_trials),"
                " (SELECT COUNT(*) FROM slotsweep_metrics)"
            )
        ).one()
        trial_id = conn.execute(sa.text("SELECT MAX(id) FROM slotsweep_trials")).scalar_one()
    print(
        f"seeded the huge experiment ({trials} trials, {metrics} metric rows) "
        f"in {time.perf_counter() - start:.1f} s"
    )

    queries = {
        "small": {
            "experiments": {},
            "experiment": {"experiment": demo.experiment_id},
            "trial": {"trial": demo.completed_trial_id},
            "cluster": {},
        },
        "huge": {
            "experiments": {},
            "experiment": {"experiment": experiment_id},
            "trial": {"trial": trial_id},
            "cluster": {},
        },
    }
    urls = {"small": small_url, "huge": huge_url}
    components: list[Any] = []
    for page in PAGES:  # Warm-up: imports and first-use costs of a running server.
        _render(small_url, page, queries["small"][page], components)

    results: dict[str, dict[str, list[float]]] = {"small": {}, "huge": {}}
    for size in ("small", "huge"):
        for page in PAGES:
            results[size][page] = [
                _render(urls[size], page, queries[size][page], components)
                for _ in range(args.repeats)
            ]

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average during the run: {load} ({os.cpu_count()} CPUs)")
    print(
        f"page render through AppTest, median of {args.repeats} cold renders (worst in brackets)"
    )
    print(f"{'page':<12} {'small search':>16} {'1,000 trials':>16} {'ratio':>7}")
    medians: dict[str, float] = {}
    for page in PAGES:
        small = statistics.median(results["small"][page])
        huge = statistics.median(results["huge"][page])
        medians[page] = huge
        print(
            f"{page:<12} {small:>7.3f} s ({max(results['small'][page]):.3f}) "
            f"{huge:>7.3f} s ({max(results['huge'][page]):.3f}) {huge / small:>6.2f}x"
        )

    print("\nOptuna plots of the 1,000-trial study, warm (computed + serialized, s):")
    for kind, seconds in _plot_seconds(huge_url, experiment_id).items():
        print(f"  {kind:<24} {seconds:.3f}")

    verdict = "meets" if max(medians.values()) < 2.0 else "MISSES"
    print(f"\nslowest page {max(medians.values()):.3f} s: {verdict} the 2 s target")
    print(
        f"max_page_s={max(medians.values()):.3f} "
        + " ".join(f"{page}_s={seconds:.3f}" for page, seconds in medians.items())
    )


if __name__ == "__main__":
    main()
