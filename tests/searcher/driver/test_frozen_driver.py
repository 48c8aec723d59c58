"""A driver stopped (SIGSTOP) past its lease, again and again, beside a search on the same slots.

Two searches share the one local agent of 2 slots through one database, on SQLite and
on PostgreSQL. One driver is stopped for longer than the slot lease at seeded random
moments of its tick, and at moments when one of its trials is claimed but not yet
launched (between a placement decision and the launch); each time it is continued
afterwards. Meanwhile the other search's decisions reclaim whatever the stopped
driver's leases no longer protect. All along, a watcher looks at every live process
that carries a launch token and asserts that no slot is ever used by two trials'
processes; at the end both searches have finished and the whole database is
consistent (no slot held by two trials, no trial run twice, nothing lost).

The lease is 3 s (``SLOTSWEEP_TIMINGS``) instead of 30, so a stop need not be long.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from storage import Allocation, Experiment, TrialRun, session_scope
from tests.conftest import POSTGRESQL
from tests.searcher.conftest import (
    assert_search_consistent,
    start_cli,
    wait_for,
    write_experiment,
)
from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR
from trials.timings import TIMINGS_ENV_VAR, lease_timings

pytestmark = pytest.mark.slow

LEASE_S = 3.0
# Each stop outlasts the lease by this much: other drivers see the leases expired.
STOP_PAST_LEASE_S = 1.5
FREEZES = 4
# How long a freeze waits for a trial claimed but not launched yet.
WINDOW_WAIT_S = 4.0
FREEZE_SEED = 26


def _experiment(folder: Path, name: str, trials: int) -> Path:
    return write_experiment(
        folder,
        name=name,
        # A few seconds of training per trial, so that the freezes land while it runs.
        entrypoint="slow_model:SlowDigitsTrial",
        data={"batch_delay_s": 0.1},
        resources={"slots_per_trial": 1},
        hyperparameters={"global_batch_size": 64},
        searcher={
            "max_trials": trials,
            "max_concurrent_trials": 2,
            "max_length": {"epochs": 1},
            "pruner": {"name": "none"},
        },
        max_restarts=5,
    )


def _claimed_not_launched(db: str, experiment_name: str) -> bool:
    """Whether a trial of the experiment holds slots with no open run yet (placed, not
    launched: the window between a decision and its launch)."""
    with session_scope(db) as session:
        held = set(
            session.scalars(
                select(Allocation.trial_id)
                .join(Experiment, Experiment.id == Allocation.experiment_id)
                .where(Experiment.name == experiment_name)
            )
        )
        if not held:
            return False
        running = set(
            session.scalars(
                select(TrialRun.trial_id).where(
                    TrialRun.trial_id.in_(held), TrialRun.ended_at.is_(None)
                )
            )
        )
    return bool(held - running)


class _SlotWatcher:
    """Samples which trials' live processes use which slot; notes every slot shared.

    A process is found by the launch token in its environment (recorded or not), and
    its slots are those its run was launched on.
    """

    def __init__(self, db: str) -> None:
        self.db = db
        self.shared: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> _SlotWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # the database may not exist yet
                self._sample()

    def _sample(self) -> None:
        tokens: dict[str, list[psutil.Process]] = defaultdict(list)
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                token = process.environ().get(LAUNCH_TOKEN_ENV_VAR)
                if token and _alive(process):
                    tokens[token].append(process)
        if not tokens:
            return
        with session_scope(self.db) as session:
            runs = session.execute(
                select(TrialRun.launch_token, TrialRun.trial_id, TrialRun.agents).where(
                    TrialRun.launch_token.in_(list(tokens))
                )
            ).all()
        users: dict[tuple[str, int], dict[int, list[psutil.Process]]] = defaultdict(dict)
        for token, trial_id, agents in runs:
            for node in agents or []:
                for slot in node.get("slots", []):
                    users[node["agent"], int(slot)][trial_id] = tokens[token]
        self.samples += 1
        for (agent, slot), trials in users.items():
            # The scan is not one instant: two trials share the slot only if a process
            # of each still runs now that both were seen.
            live = sorted(t for t, found in trials.items() if any(map(_alive, found)))
            if len(live) > 1:
                self.shared.append(f"{agent} slot {slot}: trials {live}")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _heartbeat_written(db: str, name: str) -> bool:
    with session_scope(db) as session:
        return bool(
            session.scalar(select(Experiment.driver_heartbeat_at).where(Experiment.name == name))
        )


@pytest.mark.parametrize("backend", ["sqlite", POSTGRESQL])
def test_a_driver_stopped_past_its_lease_never_shares_a_slot(
    tmp_path: Path, cli_env: dict[str, str], backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        db = f"sqlite:///{tmp_path / 'sweep.db'}"
    else:
        # A database of its own on the session's server: nothing here stops the server.
        url: str = request.getfixturevalue("postgres_url")
        db = url.replace("postgresql://", "postgresql+psycopg://", 1)
    env = {**cli_env, TIMINGS_ENV_VAR: lease_timings(LEASE_S)}
    common = ["--db", db, "--slots", "2"]
    # The stopped search is the longer one, so that every freeze finds it running.
    frozen_yaml = _experiment(tmp_path / "frozen", "frozen", trials=5)
    other_yaml = _experiment(tmp_path / "other", "other", trials=3)
    rng = random.Random(FREEZE_SEED)
    with _SlotWatcher(db) as watcher:
        frozen = start_cli(["run", str(frozen_yaml), *common], env, tmp_path)
        other = start_cli(["run", str(other_yaml), *common], env, tmp_path)
        freezes = in_window = 0
        # A freeze is noticed against the driver's previous heartbeat: the first one
        # comes after its start, however slowly a loaded machine starts it.
        wait_for(lambda: _heartbeat_written(db, "frozen"), what="the frozen driver's heartbeat")
        try:
            while freezes < FREEZES and frozen.poll() is None:
                if freezes % 2:
                    time.sleep(rng.uniform(0.2, 2.0))  # a random moment of its tick
                else:
                    # As soon as one of its trials is claimed but not launched (or
                    # at a random moment, if none is within a few seconds).
                    deadline = time.monotonic() + WINDOW_WAIT_S
                    while time.monotonic() < deadline and frozen.poll() is None:
                        with contextlib.suppress(Exception):
                            if _claimed_not_launched(db, "frozen"):
                                break
                        time.sleep(0.005)
                if frozen.poll() is not None:
                    break
                os.kill(frozen.pid, signal.SIGSTOP)
                with contextlib.suppress(Exception):
                    in_window += _claimed_not_launched(db, "frozen")
                time.sleep(LEASE_S + STOP_PAST_LEASE_S)
                os.kill(frozen.pid, signal.SIGCONT)
                freezes += 1
            _, frozen_err = frozen.communicate(timeout=600)
            _, other_err = other.communicate(timeout=600)
        finally:
            for driver in (frozen, other):
                if driver.poll() is None:
                    os.kill(driver.pid, signal.SIGCONT)
                    driver.kill()
                    driver.communicate()
    refused = frozen_err.count("nothing started, the trial waits for a new placement")
    print(
        f"freezes={freezes} in_claim_window={in_window} launches_refused={refused} "
        f"samples={watcher.samples}"
    )
    assert frozen.returncode == 0, frozen_err[-4000:]
    assert other.returncode == 0, other_err[-4000:]
    assert freezes >= 3, f"the search ended after {freezes} freezes: {frozen_err[-3000:]}"
    assert "checking its claims and runs" in frozen_err
    assert watcher.samples > 0
    assert watcher.shared == [], watcher.shared[:10]
    assert_search_consistent(db)
