"""A slot is free only when the processes on it are gone, whatever the leases say.

Two experiments share one 2-slot machine. The first one's driver dies while its trial
trains on both slots; its leases run out. The second experiment's driver must not
place anything on those slots while that trial's processes live, and must use them
as soon as they are gone.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path

import pytest
from sqlalchemy import select, update

from storage import (
    Allocation,
    Experiment,
    ProcessRole,
    QueuedTrial,
    Trial,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import (
    assert_search_consistent,
    open_runs,
    run_cli,
    start_cli,
    trial_processes,
    wait_for,
    write_experiment,
)
from trials.launch.processes import ProcessRef, is_alive

pytestmark = pytest.mark.slow


def _trial_states(db: str, experiment_name: str) -> list[TrialState]:
    with session_scope(db) as session:
        return list(
            session.scalars(
                select(Trial.state)
                .join(Experiment, Experiment.id == Trial.experiment_id)
                .where(Experiment.name == experiment_name)
            )
        )


def _decided_at(db: str, experiment_name: str) -> dt.datetime | None:
    with session_scope(db) as session:
        return session.scalar(
            select(QueuedTrial.decided_at)
            .join(Experiment, Experiment.id == QueuedTrial.experiment_id)
            .where(Experiment.name == experiment_name)
        )


def _wait_for_decisions(db: str, experiment_name: str, count: int) -> None:
    """Until ``count`` more placement decisions have looked at the experiment's queued trial."""
    seen = [_decided_at(db, experiment_name)]

    def another() -> bool:
        latest = _decided_at(db, experiment_name)
        if latest != seen[-1]:
            seen.append(latest)
        return len(seen) > count

    wait_for(another, timeout=120, what=f"{count} scheduling rounds of {experiment_name}")


def test_an_expired_lease_does_not_free_slots_a_dead_drivers_trial_still_uses(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    first = write_experiment(
        tmp_path / "first",
        name="first",
        entrypoint="slow_model:SlowDigitsTrial",
        resources={"slots_per_trial": 2},
        hyperparameters={"global_batch_size": 256},
        # Slow, and long enough to outlast the second driver's start on a loaded machine
        # (a minute at least); the resumed attempt trains fast.
        searcher={"max_trials": 1, "max_length": {"epochs": 40}, "pruner": {"name": "none"}},
        data={"batch_delay_s": 0.3, "fast_from_attempt": 1},
    )
    second = write_experiment(
        tmp_path / "second",
        name="second",
        resources={"slots_per_trial": 1},
        searcher={"max_trials": 1, "max_length": {"epochs": 1}, "pruner": {"name": "none"}},
    )
    driver = start_cli(["run", str(first), "--db", db, "--slots", "2"], cli_env, tmp_path)
    wait_for(lambda: bool(trial_processes(db, ProcessRole.RANK)), what="the first trial's ranks")
    ranks = [
        ProcessRef(p.host, p.pid, p.create_time) for p in trial_processes(db, ProcessRole.RANK)
    ]
    (torchrun,) = trial_processes(db, ProcessRole.TORCHRUN)

    # The driver dies; its trial keeps training; its leases run out.
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=30)
    with session_scope(db) as session:
        session.execute(
            update(Allocation).values(
                lease_expires_at=dt.datetime(2000, 1, 1)  # long expired
            )
        )
    other = start_cli(["run", str(second), "--db", db, "--slots", "2"], cli_env, tmp_path)
    wait_for(
        lambda: _trial_states(db, "second") == [TrialState.QUEUED] or other.poll() is not None,
        timeout=120,
        what="the second experiment's trial queued",
    )
    _wait_for_decisions(db, "second", count=3)
    assert all(is_alive(rank) for rank in ranks)
    assert other.poll() is None, other.communicate()[1][-3000:]
    assert _trial_states(db, "second") == [TrialState.QUEUED]
    with session_scope(db) as session:
        holders = set(session.scalars(select(Allocation.trial_id)))
    assert len(holders) == 1  # still the first experiment's trial

    # Its processes end (torchrun killed; its ranks die with it): the slots are used.
    os.kill(torchrun.pid, signal.SIGKILL)
    wait_for(lambda: not any(is_alive(rank) for rank in ranks), timeout=10, what="ranks gone")
    _, err = other.communicate(timeout=300)
    assert other.returncode == 0, err[-3000:]
    assert _trial_states(db, "second") == [TrialState.COMPLETED]

    # The first search resumes and completes from where it was.
    resumed = run_cli(
        ["resume", "first", "--db", db, "--slots", "2", "--no-progress"],
        cli_env,
        tmp_path,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not open_runs(db)
    assert_search_consistent(db)
