"""A driver frozen between recording a run and starting it: its ranks start nothing.

Issue 26's last window, made deterministic with real processes on SQLite and
PostgreSQL. The driver's launch confirms the trial's slot claim and records its run,
then starts ``torchrun``; here it stops itself (SIGSTOP) at the moment it would start
it, right after its last look at the claim. Its lease runs out, ``slotsweep resume``
takes the search over: it judges the recorded run gone (nothing of it exists), ends
it, frees its slot and starts its own attempts of the trials there. Once one of those
trains on the slot, the frozen driver is continued and starts the old run's
``torchrun`` after all: its ranks find the run ended before they touch anything and
exit fenced; the frozen driver then finds itself replaced and stops. The resumed search
finishes every trial once, and the database is consistent (no slot held by two
trials, no attempt overlapping another).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from storage import FENCED_EXIT_CODE, Trial, TrialProcess, TrialRun, TrialState, session_scope
from tests.conftest import POSTGRESQL
from tests.searcher.conftest import assert_search_consistent, start_cli, wait_for, write_experiment
from trials.timings import TIMINGS_ENV_VAR

pytestmark = pytest.mark.slow

LEASE_S = 3.0
# Taken as gone after this long without a heartbeat: a resume may take the search over.
STALE_S = 4.0

# ``slotsweep`` whose first launch stops the driver where it would start ``torchrun``:
# the run is recorded and its claim was checked, nothing of it runs yet.
_FROZEN_DRIVER = """
import os, signal, sys
from trials.executors import LocalExecutor
from searcher.cli import main

launch = LocalExecutor.launch
stopped = []

def stop_then_launch(self, request):
    if not stopped:
        stopped.append(request)
        os.kill(os.getpid(), signal.SIGSTOP)
    return launch(self, request)

LocalExecutor.launch = stop_then_launch
sys.exit(main(sys.argv[1:]))
"""


def _stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def _a_later_attempt_trains(db: str, trial_id: int) -> bool:
    """Whether the resumed search runs a trial on the slot whose ranks started and
    recorded themselves (they train there)."""
    with session_scope(db) as session:
        return (
            session.scalar(
                select(TrialProcess.id)
                .join(TrialRun, TrialRun.id == TrialProcess.run_id)
                .where(TrialRun.ranks_started_at.is_not(None), TrialRun.ended_at.is_(None))
                .where((TrialRun.trial_id != trial_id) | (TrialRun.attempt > 0))
                .limit(1)
            )
            is not None
        )


@pytest.mark.parametrize("backend", ["sqlite", POSTGRESQL])
def test_ranks_of_a_run_judged_gone_while_its_driver_was_frozen_start_nothing(
    tmp_path: Path, cli_env: dict[str, str], backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        db = f"sqlite:///{tmp_path / 'sweep.db'}"
    else:
        url: str = request.getfixturevalue("postgres_url")
        db = url.replace("postgresql://", "postgresql+psycopg://", 1)
    env = {
        **cli_env,
        TIMINGS_ENV_VAR: f"lease_s={LEASE_S},heartbeat_every_s=0.5,driver_stale_after_s={STALE_S}",
    }
    yaml = write_experiment(
        tmp_path / "search",
        name="search",
        entrypoint="slow_model:SlowDigitsTrial",
        data={"batch_delay_s": 0.05},
        resources={"slots_per_trial": 1},
        hyperparameters={"global_batch_size": 64},
        searcher={
            "max_trials": 2,
            "max_concurrent_trials": 1,
            "max_length": {"epochs": 1},
            "pruner": {"name": "none"},
        },
    )
    common = ["--db", db, "--slots", "1", "--no-progress"]
    frozen = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_DRIVER, "run", str(yaml), *common],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    resumed: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: _stopped(frozen.pid), what="the driver stopping before its launch")
        with session_scope(db) as session:
            (run,) = session.scalars(select(TrialRun))
            trial_id, log_path = run.trial_id, run.trial.log_path
            assert run.ended_at is None and run.ranks_started_at is None
            assert run.claim_token is not None
            assert session.scalars(select(TrialProcess)).all() == []
        time.sleep(max(LEASE_S, STALE_S) + 1.5)  # its lease and heartbeat go stale
        resumed = start_cli(["resume", "search", *common[:-1]], env, tmp_path)
        wait_for(
            lambda: resumed.poll() is not None or _a_later_attempt_trains(db, trial_id),
            what="the resumed search training on the slot",
        )
        assert resumed.poll() is None, resumed.communicate()[1][-3000:]
        os.kill(frozen.pid, signal.SIGCONT)
        _, frozen_err = frozen.communicate(timeout=300)
        resumed_out, resumed_err = resumed.communicate(timeout=600)
    finally:
        for driver in (frozen, resumed):
            if driver is not None and driver.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(driver.pid, signal.SIGCONT)
                driver.kill()
                driver.communicate()
    assert resumed.returncode == 0, resumed_err[-4000:]
    assert "another driver" in frozen_err or "stopped for too long" in frozen_err, frozen_err[
        -3000:
    ]
    with session_scope(db) as session:
        fenced = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trial_id, TrialRun.attempt == 0)
        ).one()
        # Ended by the resume before any rank started, and none did later.
        assert fenced.ended_at is not None and fenced.ranks_started_at is None
        assert fenced.progress_at is None
        trials = session.scalars(select(Trial)).all()
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 2
        for trial in trials:
            finished = [r for r in trial.runs if r.ranks_started_at is not None]
            assert len(finished) == 1, [(r.attempt, r.reason) for r in trial.runs]
    log = Path(log_path).read_text()
    # Ended, and by now superseded by the resumed search's attempt of the trial.
    assert "attempt 0 of trial" in log and "exiting before touching any device" in log, log[-3000:]
    assert f"exitcode  : {FENCED_EXIT_CODE}" not in resumed_out
    assert_search_consistent(db)
