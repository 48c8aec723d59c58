"""A trial survives its database going away for a few seconds while it reports.

Two real outages: SQLite held locked by another process's ``BEGIN IMMEDIATE``, and a
real PostgreSQL server stopped (connections terminated, then refused) and started
again. Either way the trial must end finished with every metric it reported.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import Metric, MetricKind, Trial, session_scope, upgrade_schema
from tests.conftest import PostgresServer

from .conftest import TrialHandle, create_trial, run_torchrun

BATCHES = 120
OUTAGE_S = 5.0
# Long enough that the outage falls inside the training, short enough for a test.
TRIAL_FIELDS = {
    "slots_per_trial": 1,
    "max_length": {"batches": BATCHES},
    "min_validation_period": {"batches": 40},
    "hparams": {"global_batch_size": 8, "sleep_s": 0.05},
}


def _training_metrics(db_url: str, trial_id: int) -> int:
    with session_scope(db_url) as session:
        return int(
            session.scalar(
                select(func.count()).where(
                    Metric.trial_id == trial_id, Metric.kind == MetricKind.TRAINING
                )
            )
            or 0
        )


def _during_training(handle: TrialHandle, outage: Callable[[], None]) -> threading.Thread:
    """Start ``outage`` once the trial has reported a few steps; the thread running it."""

    def wait_then_break() -> None:
        deadline = time.monotonic() + 120
        while _training_metrics(handle.db_url, handle.spec.trial_id) < 3:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        outage()

    thread = threading.Thread(target=wait_then_break, daemon=True)
    thread.start()
    return thread


def _assert_finished_with_every_metric(handle: TrialHandle, output: str) -> None:
    with session_scope(handle.db_url) as session:
        trial = session.get(Trial, handle.spec.trial_id)
        assert trial is not None
        assert trial.finished_at is not None, output[-3000:]
        steps = {
            kind: sorted(
                session.scalars(
                    select(Metric.step)
                    .where(Metric.trial_id == trial.id, Metric.kind == kind)
                    .distinct()
                )
            )
            for kind in MetricKind
        }
    assert steps[MetricKind.TRAINING] == list(range(1, BATCHES + 1))
    assert steps[MetricKind.VALIDATION] == [40, 80, 120]


@pytest.mark.slow
def test_sqlite_locked_by_another_writer_for_seconds(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(**TRIAL_FIELDS)
    path = handle.db_url.removeprefix("sqlite:///")
    still_running_after: list[bool] = []
    holder = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "c.execute('ROLLBACK')\n"
    )

    def lock() -> None:
        subprocess.run([sys.executable, "-c", holder, path, str(OUTAGE_S)], check=True, timeout=60)
        with session_scope(handle.db_url) as session:
            trial = session.get(Trial, handle.spec.trial_id)
            still_running_after.append(trial is not None and trial.finished_at is None)

    outage = _during_training(handle, lock)
    result = run_torchrun(
        ["-m", "trials.node.worker"],
        nproc=1,
        env={"SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text()},
    )
    outage.join()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert still_running_after == [True]  # the lock was held while the trial trained
    _assert_finished_with_every_metric(handle, output)


@pytest.mark.slow
def test_postgresql_restarted_while_the_trial_reports(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    upgrade_schema(postgres.url)
    handle = create_trial(postgres.url, tmp_path, **TRIAL_FIELDS)

    def restart() -> None:
        postgres.stop()
        time.sleep(OUTAGE_S)
        postgres.restart()

    outage = _during_training(handle, restart)
    result = run_torchrun(
        ["-m", "trials.node.worker"],
        nproc=1,
        env={"SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text()},
    )
    outage.join()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "database unreachable" in output  # the outage did hit the trial
    _assert_finished_with_every_metric(handle, output)
