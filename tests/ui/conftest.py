"""Fixtures for the UI tests: the databases the pages are rendered against.

Two kinds, kept apart (separate database files, separate experiments):

- ``real_search`` (slow, ~1 minute, once per session; tests/conftest.py, since the
  CLI's end-to-end test shares it): a real ``slotsweep run`` of the digits example as
  a subprocess (see :mod:`tests.real_search`). Every page has slow tests against
  it, asserting on what the driver and the runtime recorded.
- ``synthetic_search`` (a few seconds): :func:`tests._demo_data.seed_small_search`, an
  in-process stand-in whose rows are written by the runtime's own code (rank 0's
  context and recorder, the sampler's row builder). It holds the states a small real
  search cannot produce reliably (a trial restarted from a checkpoint, one that failed
  after its restarts, slots held by a running trial, a multi-objective study) and keeps
  the quick subset (``-m 'not slow'``) quick. ``huge_db`` (1,000 trials, 200,000 metric
  rows, bulk-inserted from the runtime's row builders) is synthetic as well, and so are
  ``queued_search`` (searches waiting in the cluster's queue, placed or held back by
  the real placement decision) and ``warm_search`` (warm jobs in each state).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import streamlit as st

from storage import get_engine
from tests._demo_data import (
    DemoSearch,
    QueueDemo,
    WarmDemo,
    seed_cluster_queue,
    seed_huge_experiment,
    seed_small_search,
    seed_warm_jobs,
    write_cluster_file,
)
from tests.real_search import RealSearch, run_failing_search
from tests.ui._pages import PageRenderer


def copy_database(url: str, target: Path) -> str:
    """A consistent copy of the SQLite database at ``url`` (online backup); its URL."""
    source = url.removeprefix("sqlite:///")
    with (
        contextlib.closing(sqlite3.connect(source)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)
    return f"sqlite:///{target}"


# --- The real search ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def failed_search(tmp_path_factory: pytest.TempPathFactory) -> RealSearch:
    """A real ``slotsweep run`` whose every trial raised (see ``run_failing_search``)."""
    return run_failing_search(tmp_path_factory.mktemp("failed_search"))


@pytest.fixture
def writable_running_search(real_search: RealSearch, tmp_path: Path) -> RealSearch:
    """A private copy of the real search caught mid-run, for tests that write.

    Its driver has exited since; this test process stands in for it (a live pid on this
    host, a fresh heartbeat), so requests take the path they take with a running driver.
    """
    from storage import utcnow

    url = copy_database(real_search.running_url, tmp_path / "running-copy.db")
    with get_engine(url).begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE slotsweep_experiments"
                " SET driver_pid = :pid, driver_host = :host, driver_heartbeat_at = :now"
            ),
            {"pid": os.getpid(), "host": socket.gethostname(), "now": utcnow()},
        )
    return RealSearch(**{**real_search.__dict__, "running_url": url})


@pytest.fixture
def missing_checkpoint(real_search: RealSearch) -> Iterator[tuple[int, str]]:
    """``(trial id, path)`` of a kept checkpoint of the real search whose files are gone.

    The newest kept checkpoint of the first trial is moved aside for one test, as if
    someone had deleted it by hand, and put back afterwards.
    """
    with get_engine(real_search.url).connect() as conn:
        trial_id, path = conn.execute(
            sa.text(
                "SELECT c.trial_id, c.path FROM slotsweep_checkpoints AS c"
                " JOIN slotsweep_trials AS t ON t.id = c.trial_id"
                " WHERE t.experiment_id = :e AND c.state = 'COMPLETED'"
                " ORDER BY t.optuna_trial_number, c.step DESC LIMIT 1"
            ),
            {"e": real_search.experiment_id},
        ).one()
    aside = f"{path}.aside"
    os.replace(path, aside)
    try:
        yield int(trial_id), str(path)
    finally:
        os.replace(aside, path)


# --- The synthetic stand-in ---------------------------------------------------------------


@pytest.fixture(scope="session")
def synthetic_search(tmp_path_factory: pytest.TempPathFactory) -> DemoSearch:
    """SYNTHETIC: :func:`tests._demo_data.seed_small_search` (see the module docstring).

    Experiments ``regression-demo`` (TPE + median pruner: completed, pruned, restarted,
    failed after restarts, running with slots held, a deleted and a missing checkpoint)
    and ``regression-cost`` (multi-objective). Read-only use.
    """
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("synthetic_search")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return seed_small_search(url, root)


@pytest.fixture
def writable_synthetic(
    synthetic_search: DemoSearch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> DemoSearch:
    """SYNTHETIC: a private copy of ``synthetic_search`` for tests that write (pause/kill).

    Its drivers' heartbeats are renewed, and stay fresh for the test: the session's seed
    may be minutes old on a busy machine, and a driver silent longer than the tests' short
    staleness (``SLOTSWEEP_TIMINGS``) counts as dead, so requests would act directly (seen
    at a load average of 15: the page said PAUSED instead of "Requested pause").
    """
    from storage import utcnow
    from trials.timings import TIMINGS_ENV_VAR

    timings = os.environ.get(TIMINGS_ENV_VAR, "")
    monkeypatch.setenv(TIMINGS_ENV_VAR, f"{timings},driver_stale_after_s=600".lstrip(","))

    url = copy_database(synthetic_search.url, tmp_path / "copy.db")
    with get_engine(url).begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE slotsweep_experiments SET driver_heartbeat_at = :now"
                " WHERE driver_heartbeat_at IS NOT NULL"
            ),
            {"now": utcnow()},
        )
    return DemoSearch(**{**synthetic_search.__dict__, "url": url})


@pytest.fixture(scope="session")
def queued_search(tmp_path_factory: pytest.TempPathFactory) -> QueueDemo:
    """SYNTHETIC: searches waiting in one cluster queue (``seed_cluster_queue``).

    Their own database and cluster file (``cluster_file``: set ``$SLOTSWEEP_CLUSTER`` to
    it), apart from ``synthetic_search``. The waiting trials were placed or held back by
    the real placement decision: a 4-slot priority-1 trial reserving both agents of pool
    ``default`` by backfilling, a paused experiment's trial, a placed trial of pool
    ``small``. Read-only use.
    """
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("queued_search")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return seed_cluster_queue(url, root)


@pytest.fixture(scope="session")
def warm_search(tmp_path_factory: pytest.TempPathFactory) -> WarmDemo:
    """SYNTHETIC: a ``reuse_workers`` search's warm jobs (``seed_warm_jobs``): one runs a
    trial, one is reserved for the next, one is idle, one ending; a fifth agent is free.

    Its own database and cluster file (``cluster_file``). Read-only use.
    """
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("warm_search")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return seed_warm_jobs(url, root)


@pytest.fixture(scope="session")
def huge_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """SYNTHETIC: one experiment of 1,000 trials and 200,000 metric rows (bulk inserts)."""
    from storage import upgrade_schema

    root = tmp_path_factory.mktemp("huge")
    url = f"sqlite:///{root / 'slotsweep.db'}"
    upgrade_schema(url)
    return url, seed_huge_experiment(url)


@pytest.fixture(scope="session")
def cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster file declaring the agents the synthetic data uses."""
    return write_cluster_file(tmp_path_factory.mktemp("cluster") / "cluster.yaml")


# --- Rendering ----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_streamlit_caches() -> Iterator[None]:
    # Cached study snapshots and cluster layouts must not leak from one test to the next.
    st.cache_resource.clear()
    st.cache_data.clear()
    yield


@pytest.fixture
def render(monkeypatch: pytest.MonkeyPatch, cluster_file: Path) -> PageRenderer:
    """``render("trial", url, trial=3)``: the page after one full run, ready to inspect.

    The Cluster page reads ``$SLOTSWEEP_CLUSTER``: the synthetic layout here; tests of
    the real search set it to the file their search ran with.
    """
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(cluster_file))
    return PageRenderer(monkeypatch)
