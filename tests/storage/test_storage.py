"""Storage on real databases: migrations, idempotent metric writes, multi-process SQLite."""

from __future__ import annotations

import math
import multiprocessing
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    Metric,
    MetricKind,
    Trial,
    absolute_db_url,
    get_engine,
    optuna_storage,
    record_metrics,
    redact_url,
    session_scope,
    upgrade_schema,
)
from storage._migrate import VERSION_TABLE, alembic_config, current_revision, head_revision
from storage._models import Base
from tests.conftest import add_experiment


def _check_database(url: str) -> None:
    upgrade_schema(url)
    upgrade_schema(url)  # Idempotent.
    assert current_revision(url) == head_revision()
    tables = set(inspect(get_engine(url)).get_table_names())
    assert {"slotsweep_experiments", "slotsweep_metrics", VERSION_TABLE} <= tables
    # Optuna's own tables and version bookkeeping live beside ours, untouched.
    study = optuna.create_study(storage=optuna_storage(url), study_name="shared")
    study.tell(study.ask(), 1.0)
    assert optuna.load_study(study_name="shared", storage=url).best_value == 1.0

    (trial_id,) = add_experiment(url, [{"hparams": {"lr": 0.1}}])[1]
    with session_scope(url) as session:
        record_metrics(session, trial_id, 10, MetricKind.TRAINING, {"loss": 1.0, "acc": 0.5})
    with session_scope(url) as session:
        # A restarted trial records step 10 again: replaced, never duplicated.
        record_metrics(session, trial_id, 10, MetricKind.TRAINING, {"loss": 0.9}, epoch=1.0)
        record_metrics(session, trial_id, 10, MetricKind.VALIDATION, {"loss": 2.0})
    with session_scope(url) as session:
        rows = session.execute(
            select(Metric.kind, Metric.name, Metric.value)
            .where(Metric.trial_id == trial_id)
            .order_by(Metric.kind, Metric.name)
        ).all()
    assert [(k.value, n, v) for k, n, v in rows] == [
        ("training", "acc", 0.5),
        ("training", "loss", 0.9),
        ("validation", "loss", 2.0),
    ]

    # A diverged loss: NaN is stored as NULL (SQLite has no NaN), infinities as they are.
    with session_scope(url) as session:
        record_metrics(
            session, trial_id, 11, MetricKind.TRAINING, {"loss": math.nan, "grad": math.inf}
        )
    with session_scope(url) as session:
        stored = dict(
            session.execute(
                select(Metric.name, Metric.value).where(
                    Metric.trial_id == trial_id, Metric.step == 11
                )
            ).all()
        )
    assert stored == {"loss": None, "grad": math.inf}

    # The migrations build exactly the models' schema.
    with get_engine(url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert [d for d in differences if "slotsweep" in str(d) and VERSION_TABLE not in str(d)] == []


def test_sqlite_schema_and_metrics(db_url: str) -> None:
    _check_database(db_url)
    with get_engine(db_url).connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert int(connection.execute(text("PRAGMA busy_timeout")).scalar() or 0) >= 10_000


def test_an_experiment_from_before_revision_0013_keeps_its_id_as_checkpoint_folder(
    tmp_path: Path,
) -> None:
    """Its checkpoints stay where they were; a new one's folder is its id and a random key,
    a name no other database's experiment of that id has."""
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0012")
    with get_engine(url).begin() as connection:
        connection.execute(
            text(
                "INSERT INTO slotsweep_experiments (name, study_name, state, config, "
                "model_dir, max_trials, created_at) VALUES ('old', 'old-1', 'PAUSED', '{}', "
                "'.', 1, '2026-11-01 00:00:00')"
            )
        )
    upgrade_schema(url)
    new_id, _ = add_experiment(url)
    with session_scope(url) as session:
        old, new = session.get_one(Experiment, 1), session.get_one(Experiment, new_id)
        assert (old.checkpoint_key, old.checkpoint_folder, old.owns_checkpoint_folder) == (
            None,
            "1",
            False,
        )
        assert re.fullmatch(r"2-[0-9a-f]{12}", new.checkpoint_folder), new.checkpoint_folder
        assert new.owns_checkpoint_folder


@pytest.mark.slow
def test_a_database_from_before_revision_0014_can_mark_a_checkpoint_corrupted(
    tmp_path: Path,
) -> None:
    """Its checkpoints stay as they were; the new state and its reason can be written, and
    a downgrade leaves a CORRUPTED checkpoint as one the older code never restores from."""
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0013")
    _, (trial_id,) = add_experiment(url)
    with get_engine(url).begin() as connection:
        connection.execute(
            text(
                "INSERT INTO slotsweep_checkpoints (uuid, trial_id, step, path, size_bytes, "
                "metrics, state, created_at) VALUES ('c1', :t, 4, '/c/c1', 1, '{}', "
                "'COMPLETED', '2026-11-01 00:00:00')"
            ),
            {"t": trial_id},
        )
    upgrade_schema(url)
    assert current_revision(url) == head_revision() == "0015"
    with session_scope(url) as session:
        row = session.scalars(select(Checkpoint)).one()
        assert (row.state, row.problem) == (CheckpointState.COMPLETED, None)
        row.state, row.problem = CheckpointState.CORRUPTED, "state.pt is missing"
    with session_scope(url) as session:
        row = session.scalars(select(Checkpoint)).one()
        assert (row.state, row.problem) == (CheckpointState.CORRUPTED, "state.pt is missing")
    command.downgrade(alembic_config(url), "0013")
    with get_engine(url).connect() as connection:
        assert connection.execute(text("SELECT state FROM slotsweep_checkpoints")).all() == [
            ("DELETED",)
        ]
        columns = {c["name"] for c in inspect(connection).get_columns("slotsweep_checkpoints")}
        assert "problem" not in columns


def test_postgresql_schema_and_metrics(postgres_url: str) -> None:
    _check_database(postgres_url)


def _hammer(url: str, trial_id: int, worker: int, steps: int) -> None:
    for step in range(steps):
        with session_scope(url) as session:
            record_metrics(
                session, trial_id, step, MetricKind.TRAINING, {f"loss_{worker}": float(step)}
            )
            trial = session.get(Trial, trial_id)
            assert trial is not None
            trial.total_batches = step


@pytest.mark.slow
def test_concurrent_sqlite_writers_never_see_database_locked(db_url: str) -> None:
    (trial_id,) = add_experiment(db_url, [{"hparams": {"lr": 0.1}}])[1]
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_hammer, args=(db_url, trial_id, worker, 60)) for worker in range(4)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [p.exitcode for p in workers] == [0, 0, 0, 0]
    with session_scope(db_url) as session:
        count = session.scalar(select(func.count()).where(Metric.trial_id == trial_id))
    assert count == 4 * 60


def _first_connect(url: str, barrier: Any, failures: Any) -> None:
    barrier.wait()
    try:
        with get_engine(url).connect():
            pass
    except Exception as exc:  # reported to the parent, which asserts on it
        failures.put(f"{type(exc).__name__}: {exc}".splitlines()[0])


@pytest.mark.slow
def test_processes_opening_a_new_sqlite_file_at_once_all_connect(tmp_path: Path) -> None:
    # Each connection switches the file to WAL; on a brand-new file two of them can each
    # hold a read lock and want the write lock, and SQLite fails one at once instead of
    # waiting. Forked workers released by a barrier hit that window often.
    context = multiprocessing.get_context("fork")
    failures = context.Queue()
    for round_ in range(40):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        barrier = context.Barrier(6)
        workers = [
            context.Process(target=_first_connect, args=(url, barrier, failures)) for _ in range(6)
        ]
        for process in workers:
            process.start()
        for process in workers:
            process.join(timeout=120)
        assert [p.exitcode for p in workers] == [0] * 6
    assert failures.empty(), failures.get()


def test_urls_are_made_absolute_and_passwords_hidden(tmp_path: Path) -> None:
    assert absolute_db_url("sqlite:///x.db", str(tmp_path)) == f"sqlite:///{tmp_path}/x.db"
    assert absolute_db_url("sqlite://") == "sqlite://"
    hidden = redact_url("postgresql://me:secret@db:5432/sweeps")
    assert "secret" not in hidden and "me" in hidden


def test_a_writer_waits_for_the_write_lock_and_takes_it_once_let_go(db_url: str) -> None:
    # SQLite's busy handler is off while the lock is tried again and again (finer than
    # its own 1-100 ms sleeps); the connection's busy timeout is back on afterwards.
    (trial_id,) = add_experiment(db_url, [{"hparams": {"lr": 0.1}}])[1]
    path = make_url(db_url).database
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    let_go = threading.Event()

    def release() -> None:
        let_go.set()
        holder.execute("ROLLBACK")

    timer = threading.Timer(0.3, release)
    timer.start()
    with session_scope(db_url) as session:
        record_metrics(session, trial_id, 1, MetricKind.TRAINING, {"loss": 0.5})
    assert let_go.is_set()
    timer.join()
    holder.close()
    with get_engine(db_url).connect() as connection:
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
    with session_scope(db_url) as session:
        assert session.scalar(select(func.count()).where(Metric.trial_id == trial_id)) == 1
