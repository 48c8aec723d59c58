"""Render time of each UI page on huge experiments, against a small search in the same run.

Seeds three SQLite databases: a small synthetic search (the baseline), one experiment of
1,000 trials and 200,000 metric rows, and one of 10,000 trials and 2,000,000 metric
rows beside a second experiment of 1,000 trials (``tests._demo_data.seed_huge_experiment``,
bulk inserts of the rows the runtime writes), then renders each page of the real app through
``streamlit.testing.v1.AppTest``: Experiments, Experiment (the largest experiment: header,
learning curves, default plot, trials table), Trial (a trial of it), Compare (3 of its
trials; and its experiment against the other one) and Cluster. Every timed render starts
with Streamlit's caches cleared, so the Experiment page reads the Optuna study from the
database each time. The process is warmed up first (imports, one render of each page),
as a running server would be. Each Optuna plot the Experiment page offers on request is
timed as well, on the 10,000-trial study.

Target: every page under 2 s at 10,000 trials. The last line is machine-readable:
``max_page_s=<x> experiments_s=<a> experiment_s=<b> ...`` (the median of ``--repeats``
cold renders per page at 10,000 trials).

Usage: ``.venv/bin/python bench/ui_render.py [--repeats 3] [--keep DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

PAGES = {
    "experiments": "views/experiments.py",
    "experiment": "views/experiment.py",
    "trial": "views/trial.py",
    "compare": "views/compare.py",
    "compare_experiments": "views/compare.py",
    "cluster": "views/cluster.py",
}
SIZES = {"small": "small search", "1k": "1,000 trials", "10k": "10,000 trials"}
REPO_ROOT = Path(__file__).resolve().parents[1]


def _demo_data() -> ModuleType:
    """``tests._demo_data``, the seeds the UI's tests use (test fixtures, not installed).

    The repository's root goes first on the path, as pytest puts it (``pythonpath``).
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import tests._demo_data

    return tests._demo_data


def _render(url: str, page: str, query: dict[str, Any], components: list[Any]) -> float:
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
    """The study's snapshot and each Optuna plot drawn from it (shown on request)."""
    import sqlalchemy as sa

    from storage import get_engine
    from ui import _plots

    with get_engine(url).connect() as conn:
        study_name = conn.execute(
            sa.text("SELECT study_name FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment_id},
        ).scalar_one()
    import optuna

    start = time.perf_counter()
    study = _plots.snapshot_study(url, study_name)
    seconds = {"snapshot": time.perf_counter() - start}
    # The seed's running trials start "in the future" (one every 40 s from 12 h ago), and
    # the timeline warns once per such trial; the figures are what is measured here.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    _plots.preload_importance_backend()  # A one-time import, started early by the page.
    params = _plots.searched_params(study)
    for kind in _plots.available_plots(len(study.directions)):
        # What the page draws by default: contour and rank of 2 parameters, slice of 4.
        chosen = params[:4] if kind == _plots.SLICE else params[:2]
        _plots.make_plot(study, kind, ["val_loss"], chosen)  # First use of plotly's code.
        start = time.perf_counter()
        figure, reason = _plots.make_plot(study, kind, ["val_loss"], chosen)
        if figure is None:
            raise RuntimeError(f"{kind}: {reason}")
        figure.to_json()  # What st.plotly_chart sends to the browser.
        seconds[kind] = time.perf_counter() - start
    return seconds


def _seed(url: str, n_trials: int, *, seed: int = 0) -> tuple[int, int, list[int]]:
    """One huge experiment of ``n_trials`` trials and 200 metric rows each.

    Returns the experiment id, its newest trial id and the ids of three of its trials.
    """
    import sqlalchemy as sa

    from storage import get_engine

    experiment_id = _demo_data().seed_huge_experiment(
        url, n_trials=n_trials, metric_rows=200 * n_trials, seed=seed
    )
    with get_engine(url).connect() as conn:
        ids = [
            int(i)
            for (i,) in conn.execute(
                sa.text(
                    "SELECT id FROM slotsweep_trials WHERE experiment_id = :e"
                    " ORDER BY optuna_trial_number"
                ),
                {"e": experiment_id},
            )
        ]
    return experiment_id, ids[-1], ids[: 3 * 7 : 7]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="seed into DIR and keep it")
    args = parser.parse_args()

    import sqlalchemy as sa

    from storage import get_engine, upgrade_schema

    demo_data = _demo_data()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ui_render_"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["SLOTSWEEP_CLUSTER"] = str(demo_data.write_cluster_file(root / "cluster.yaml"))

    urls = {size: f"sqlite:///{root / f'{size}.db'}" for size in SIZES}
    for url in urls.values():
        upgrade_schema(url)
    start = time.perf_counter()
    demo = demo_data.seed_small_search(urls["small"], root / "small")
    print(f"seeded the small search (baseline) in {time.perf_counter() - start:.1f} s")
    queries: dict[str, dict[str, dict[str, Any]]] = {
        "small": {
            "experiments": {},
            "experiment": {"experiment": demo.experiment_id},
            "trial": {"trial": demo.completed_trial_id},
            "compare": {"trials": f"{demo.completed_trial_id},{demo.restarted_trial_id}"},
            "compare_experiments": {
                "experiments": f"{demo.experiment_id},{demo.multi_objective_experiment_id}"
            },
            "cluster": {},
        }
    }
    for size, n_trials in (("1k", 1000), ("10k", 10_000)):
        start = time.perf_counter()
        # The 10,000-trial database also holds a finished 1,000-trial search to compare
        # it with; its slots are given back, since both seeds place running trials on
        # the same slots.
        other = _seed(urls[size], 1000, seed=1)[0] if size == "10k" else None
        if other is not None:
            with get_engine(urls[size]).begin() as conn:
                conn.execute(
                    sa.text("DELETE FROM slotsweep_allocations WHERE experiment_id = :e"),
                    {"e": other},
                )
        experiment_id, newest, three = _seed(urls[size], n_trials)
        with get_engine(urls[size]).connect() as conn:
            trials, metrics = conn.execute(
                sa.text(
                    "SELECT (SELECT COUNT(*) FROM slotsweep_trials),"
                    " (SELECT COUNT(*) FROM slotsweep_metrics)"
                )
            ).one()
        print(
            f"seeded {SIZES[size]} ({trials} trials, {metrics} metric rows in the database) "
            f"in {time.perf_counter() - start:.1f} s"
        )
        queries[size] = {
            "experiments": {},
            "experiment": {"experiment": experiment_id},
            "trial": {"trial": newest},
            "compare": {"trials": ",".join(map(str, three))},
            # With one experiment only, the page asks for a second one.
            "compare_experiments": {
                "experiments": ",".join(str(i) for i in (experiment_id, other) if i is not None)
            },
            "cluster": {},
        }

    components: list[Any] = []
    for page in PAGES:  # Warm-up: imports and first-use costs of a running server.
        _render(urls["small"], page, queries["small"][page], components)

    results: dict[str, dict[str, list[float]]] = {size: {} for size in SIZES}
    for size in SIZES:
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
    print(f"{'page':<20}" + "".join(f"{label:>22}" for label in SIZES.values()) + "  10k/small")
    medians: dict[str, float] = {}
    for page in PAGES:
        cells = [
            f"{statistics.median(results[size][page]):>9.3f} s ({max(results[size][page]):.3f})"
            for size in SIZES
        ]
        medians[page] = statistics.median(results["10k"][page])
        ratio = medians[page] / statistics.median(results["small"][page])
        print(f"{page:<20}" + "".join(f"{c:>22}" for c in cells) + f"  {ratio:>8.2f}x")

    print("\nOptuna plots of the 10,000-trial study, warm (computed + serialized, s):")
    experiment_10k = int(queries["10k"]["experiment"]["experiment"])
    for kind, seconds in _plot_seconds(urls["10k"], experiment_10k).items():
        print(f"  {kind:<24} {seconds:.3f}")

    slowest = max(medians.values())
    verdict = "meets" if slowest < 2.0 else "MISSES"
    print(f"\nslowest page at 10,000 trials {slowest:.3f} s: {verdict} the 2 s target")
    print(
        f"max_page_s={slowest:.3f} "
        + " ".join(f"{page}_s={seconds:.3f}" for page, seconds in medians.items())
    )


if __name__ == "__main__":
    main()
