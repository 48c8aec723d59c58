"""A stand-in for the driver and rank 0 writing while the UI reads (run as a subprocess).

``python -m tests.ui._writer URL TRIAL_ID STUDY_NAME STOP_FILE PROGRESS_FILE``

It writes the way they do (slotsweep rows through ``session_scope``; Optuna asks,
reports and tells through ``optuna_storage``) in a loop until STOP_FILE exists, with
SQLite's busy timeout set to 0: any lock that a reader took would fail a write at
once with "database is locked" instead of being waited out. Exit code 0 and the
iteration count in PROGRESS_FILE mean every write succeeded.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sqlalchemy import event


def _no_waiting(engine: Any) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout = 0")

    engine.dispose()


def main(url: str, trial_id: int, study_name: str, stop_file: Path, progress: Path) -> int:
    import optuna

    from storage import (
        MetricKind,
        Timing,
        Trial,
        get_engine,
        optuna_storage,
        record_metrics,
        session_scope,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _no_waiting(get_engine(url))
    storage = optuna_storage(url)
    _no_waiting(storage.engine)
    study = optuna.load_study(study_name=study_name, storage=storage)
    step = 10_000
    iterations = 0
    partial = progress.with_suffix(".partial")
    deadline = time.monotonic() + 300
    try:
        while not stop_file.exists() and time.monotonic() < deadline:
            step += 1
            with session_scope(url) as session:
                record_metrics(session, trial_id, step, MetricKind.TRAINING, {"loss": 1.0 / step})
                session.get_one(Trial, trial_id).total_batches = step
            with session_scope(url) as session:
                session.add(
                    Timing(
                        trial_id=trial_id,
                        name="train_batch",
                        start_step=step - 1,
                        end_step=step,
                        count=1,
                        mean_s=0.01,
                        p50_s=0.01,
                        p95_s=0.01,
                        total_s=0.01,
                    )
                )
            if iterations % 5 == 0:
                trial = study.ask()
                trial.report(1.0 / step, 1)
                study.tell(trial, 1.0 / step)
            iterations += 1
            # Atomic, so the test never reads a half-written count.
            partial.write_text(str(iterations))
            os.replace(partial, progress)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    url, trial_id, study_name, stop_file, progress = sys.argv[1:6]
    sys.exit(main(url, int(trial_id), study_name, Path(stop_file), Path(progress)))
