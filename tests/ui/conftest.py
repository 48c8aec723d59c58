"""Fixtures for the UI tests: seeded databases and a helper that renders one page.

``small_search`` is THE fixture to switch to a real ``slotsweep run`` once the driver
and a tiny example config exist: today it is seeded by
:func:`ui._demo_data.seed_small_search`, a genuine in-process search (real Optuna
study, real torch training, checkpoints written by ``torch.save``) that records every
state the pages must show. A run of the driver must yield the same kinds of rows
(completed, pruned, failed, restarted and running trials, a deleted and a missing
checkpoint, a multi-objective experiment) for the page tests to keep their meaning.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st

from tests.ui._pages import PageRenderer
from ui._demo_data import DemoSearch, seed_huge_experiment, seed_small_search, write_cluster_file


@pytest.fixture(scope="session")
def small_search(tmp_path_factory: pytest.TempPathFactory) -> DemoSearch:
    """A database holding a small real search (see the module docstring). Read-only use."""
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("small_search")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return seed_small_search(url, root)


@pytest.fixture
def writable_search(small_search: DemoSearch, tmp_path: Path) -> DemoSearch:
    """A private copy of ``small_search`` for tests that write (pause/kill)."""
    source = small_search.url.removeprefix("sqlite:///")
    target = tmp_path / "copy.db"
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return DemoSearch(**{**small_search.__dict__, "url": f"sqlite:///{target}"})


@pytest.fixture(scope="session")
def huge_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A database with one experiment of 1,000 trials and 200,000 metric rows."""
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("huge")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return url, seed_huge_experiment(url)


@pytest.fixture(scope="session")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster file declaring the agents the seeded data uses."""
    return write_cluster_file(tmp_path_factory.mktemp("cluster") / "cluster.yaml")


@pytest.fixture(autouse=True)
def _fresh_streamlit_caches() -> Iterator[None]:
    # Cached study snapshots and cluster layouts must not leak from one test to the next.
    st.cache_resource.clear()
    st.cache_data.clear()
    yield


@pytest.fixture
def render(monkeypatch: pytest.MonkeyPatch, cluster_file: Path) -> PageRenderer:
    """``render("trial", url, trial=3)``: the page after one full run, ready to inspect."""
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(cluster_file))
    return PageRenderer(monkeypatch)
