"""A whole search survives its PostgreSQL server restarting while trials report.

The driver (asking Optuna, placing, reaping) and every trial's rank 0 (metrics,
checkpoints) lose their connections at once; both wait the outage out and the search
ends as if nothing had happened: every trial completed, nothing lost or duplicated.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import Metric, session_scope
from tests.conftest import PostgresServer
from tests.searcher.conftest import assert_search_consistent, start_cli, write_experiment

pytestmark = pytest.mark.slow

OUTAGE_S = 4.0


def _metric_rows(url: str) -> int:
    try:
        with session_scope(url) as session:
            return int(session.scalar(select(func.count()).select_from(Metric)) or 0)
    except Exception:
        return 0


def test_search_survives_a_postgresql_restart(
    postgres: PostgresServer, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    url = postgres.url.replace("postgresql://", "postgresql+psycopg://")
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="slow_model:SlowDigitsTrial",
        hyperparameters={"global_batch_size": 256},
        searcher={
            # The outage hits the first trial; the second is asked and placed after it.
            "max_trials": 2,
            "max_length": {"epochs": 4},
            "max_concurrent_trials": 1,
            "pruner": {"name": "none"},
        },
        data={"batch_delay_s": 0.1},
    )
    driver = start_cli(["run", str(path), "--db", url], cli_env, tmp_path)
    restarted = threading.Event()

    def restart_once_trials_report() -> None:
        deadline = time.monotonic() + 240
        while _metric_rows(url) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        postgres.stop()
        time.sleep(OUTAGE_S)
        postgres.restart()
        restarted.set()

    outage = threading.Thread(target=restart_once_trials_report, daemon=True)
    outage.start()
    _, err = driver.communicate(timeout=600)
    outage.join(timeout=60)
    assert restarted.is_set(), "the outage never happened"
    assert driver.returncode == 0, err[-4000:]
    assert "unreachable" in err  # the driver saw the outage and waited it out
    assert_search_consistent(url)
