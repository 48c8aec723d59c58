"""One queue for every search: real drivers of different experiments on one database.

Each test starts two ``slotsweep run`` processes with one cluster file, as two users
of one machine would, and checks the order in which their real ``torchrun`` trials
start: priority across experiments (with backfilling's reservation), fair share among
experiments of equal priority, preemption with a checkpoint and resume, and a driver
killed while its trials wait.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from storage import Experiment, QueuedTrial, Trial, TrialRun, session_scope
from tests.searcher.conftest import (
    assert_search_consistent,
    run_cli,
    start_cli,
    wait_for,
    write_experiment,
)

pytestmark = pytest.mark.slow


def _cluster_file(tmp_path: Path, agents: list[int], **pool: Any) -> Path:
    """A cluster file of one pool whose agents (names unique to this test) have these sizes."""
    tag = uuid.uuid4().hex[:6]
    path = tmp_path / "cluster.yaml"
    agents_yaml = [
        {"name": f"node{i}-{tag}", "host": "127.0.0.1", "slots": size}
        for i, size in enumerate(agents)
    ]
    path.write_text(
        yaml.safe_dump({"resource_pools": [{"name": "default", "agents": agents_yaml, **pool}]})
    )
    return path


def _experiment(tmp_path: Path, name: str, **overrides: Any) -> Path:
    return write_experiment(
        tmp_path / name,
        name=name,
        entrypoint="slow_model:SlowDigitsTrial",
        **overrides,
    )


def _search(trials: int, concurrent: int, epochs: int = 1) -> dict[str, Any]:
    return {
        "name": "random",
        "max_trials": trials,
        "max_concurrent_trials": concurrent,
        "pruner": {"name": "none"},
        "max_length": {"epochs": epochs},
    }


def _starts(db: str, name: str) -> list[Any]:
    """When each run of the experiment called ``name`` started, in order."""
    with session_scope(db) as session:
        return sorted(
            session.scalars(
                select(TrialRun.started_at)
                .join(Trial, Trial.id == TrialRun.trial_id)
                .join(Experiment, Experiment.id == Trial.experiment_id)
                .where(Experiment.name == name)
            )
        )


def _queued_reasons(db: str, name: str) -> list[str | None]:
    with session_scope(db) as session:
        return list(
            session.scalars(
                select(QueuedTrial.reason)
                .join(Experiment, Experiment.id == QueuedTrial.experiment_id)
                .where(Experiment.name == name)
            )
        )


def _finish(driver: subprocess.Popen[str], timeout: float = 600) -> str:
    out, err = driver.communicate(timeout=timeout)
    assert driver.returncode == 0, f"{out}\n{err[-4000:]}"
    return out + err


def test_a_priority_one_trial_starts_before_later_trials_of_another_search(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # On SQLite; two drivers share one PostgreSQL database in tests/searcher/test_ray.py
    # and test_frozen_driver.py.
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    cluster = _cluster_file(tmp_path, [1, 1])
    common = ["--db", db, "--cluster", str(cluster)]
    low_name, high_name = f"low-{uuid.uuid4().hex[:6]}", f"high-{uuid.uuid4().hex[:6]}"
    # Each trial takes both agents, so the low-priority trials run one at a time. The
    # second waits at its start, holding both agents, until the priority-1 trial has
    # been seen waiting (a gate the test opens), however slowly the other driver starts.
    gate = tmp_path / "high-queued"
    low = _experiment(
        tmp_path,
        low_name,
        searcher=_search(trials=3, concurrent=3),
        data={"gate_file": str(gate), "slow_trials": [1]},
    )
    high = _experiment(
        tmp_path,
        high_name,
        resources={"slots_per_trial": 2, "priority": 1},
        searcher=_search(trials=1, concurrent=1),
    )
    low_driver = start_cli(["run", str(low), *common], cli_env, tmp_path)
    wait_for(lambda: len(_starts(db, low_name)) == 2, what="two low-priority trials running")
    high_driver = start_cli(["run", str(high), *common], cli_env, tmp_path)
    # The 2-slot trial waits for both agents, which it reserves: no later trial of the
    # other search starts on them meanwhile, though they free up one at a time.
    wait_for(lambda: bool(_queued_reasons(db, high_name)), what="the priority-1 trial queued")
    wait_for(
        lambda: any(reason for reason in _queued_reasons(db, low_name)),
        what="a waiting reason for the other search's trials",
    )
    listed = run_cli(["task", "list", "--json", *common], cli_env, tmp_path)
    text = run_cli(["task", "list", *common], cli_env, tmp_path)
    assert listed.returncode == 0 and text.returncode == 0, listed.stderr + text.stderr
    queue = json.loads(listed.stdout)["queue"]
    # The queue in order: the priority-1 trial first (waiting, or placed and starting),
    # then the other search's by arrival, each with its reason.
    assert queue[0]["trial"].endswith(".0") and queue[0]["priority"] == 1, queue
    assert all(row["priority"] == 42 and row["reason"] for row in queue[1:]), queue
    assert "Queue" in text.stdout and max(map(len, text.stdout.splitlines())) <= 80
    gate.touch()
    _finish(high_driver)
    _finish(low_driver)
    (high_start,) = _starts(db, high_name)
    low_starts = _starts(db, low_name)
    assert len(low_starts) == 3
    with session_scope(db) as session:
        queued_at = session.scalar(
            select(Trial.created_at).join(Experiment).where(Experiment.name == high_name)
        )
    assert queued_at is not None
    # No trial of the other search started after the priority-1 trial was queued
    # (a decision under way then may still start one: 2 s of margin) until it ran.
    later = [t for t in low_starts if (t - queued_at).total_seconds() > 2.0]
    assert later and all(t > high_start for t in later), (low_starts, queued_at, high_start)
    assert_search_consistent(db)


def test_fair_share_between_two_searches_of_equal_priority(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    cluster = _cluster_file(tmp_path, [2])
    common = ["--db", db, "--cluster", str(cluster)]
    # "big" queues three trials at once; "small" arrives later with two. Each trial
    # takes both slots, so they run one at a time.
    # The big search's trials wait at their start until the small search is queued:
    # the first holds both slots meanwhile, so the order is decided with both waiting.
    gate = tmp_path / "small-queued"
    big = _experiment(
        tmp_path, "big", searcher=_search(trials=3, concurrent=3), data={"gate_file": str(gate)}
    )
    small = _experiment(tmp_path, "small", searcher=_search(trials=2, concurrent=2))
    big_driver = start_cli(["run", str(big), *common], cli_env, tmp_path)
    wait_for(lambda: len(_starts(db, "big")) == 1, what="the big search running")
    small_driver = start_cli(["run", str(small), *common], cli_env, tmp_path)
    wait_for(lambda: len(_queued_reasons(db, "small")) == 2, what="the small search queued")
    gate.touch()
    _finish(small_driver)
    _finish(big_driver)
    small_starts = _starts(db, "small")
    big_starts = _starts(db, "big")
    # FIFO would start all three of the big search's trials first. Fair share: the two
    # searches take turns (neither holds a slot between trials; the one served least
    # recently goes next), so the small one's second trial starts before the big
    # one's third.
    started_before = [t for t in big_starts if t < small_starts[-1]]
    assert len(big_starts) == 3 and len(started_before) <= 2, (big_starts, small_starts)
    assert_search_consistent(db)


def test_preemption_checkpoints_the_lower_priority_trial_and_resumes_it(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    cluster = _cluster_file(tmp_path, [2], preemption=True)
    common = ["--db", db, "--cluster", str(cluster)]
    low = _experiment(
        tmp_path,
        "low",
        resources={"slots_per_trial": 2},
        # The first attempt would train for over two minutes: the high-priority driver
        # starts and preempts it long before, however loaded the machine (at a load
        # average of 20, 35 s were not enough). The resumed attempt trains fast.
        searcher=_search(trials=1, concurrent=1, epochs=30),
        data={"batch_delay_s": 0.2, "fast_from_attempt": 1},
    )
    high = _experiment(
        tmp_path,
        "high",
        resources={"slots_per_trial": 2, "priority": 1},
        searcher=_search(trials=1, concurrent=1),
    )
    low_driver = start_cli(["run", str(low), *common], cli_env, tmp_path)

    def low_checkpointed() -> bool:
        with session_scope(db) as session:
            return bool(session.scalar(select(TrialRun.progress_at)))

    wait_for(low_checkpointed, what="the low-priority trial training")
    _finish(start_cli(["run", str(high), *common], cli_env, tmp_path))
    _finish(low_driver)
    with session_scope(db) as session:
        (low_trial,) = session.scalars(
            select(Trial).join(Experiment).where(Experiment.name == "low")
        )
        runs = list(
            session.scalars(
                select(TrialRun)
                .where(TrialRun.trial_id == low_trial.id)
                .order_by(TrialRun.attempt)
            )
        )
        (high_trial,) = session.scalars(
            select(Trial).join(Experiment).where(Experiment.name == "high")
        )
        (high_run,) = high_trial.runs
        assert low_trial.state.value == "COMPLETED" and high_trial.state.value == "COMPLETED"
        # One preemption, no failure: the restart budget is untouched.
        assert low_trial.restarts == 0
        assert len(runs) == 2, [(r.attempt, r.reason) for r in runs]
        assert (runs[0].stop_reason or "").startswith(
            f"preempted by trial {high_trial.experiment_id}.0"
        )
        assert "resumes from its latest checkpoint" in (runs[0].reason or "")
        # The second attempt continued from the checkpoint written when it stopped.
        assert runs[1].restored_from_checkpoint is not None
        # The high-priority trial ran in between.
        assert runs[0].ended_at is not None and runs[0].ended_at <= high_run.started_at
        assert high_run.ended_at is not None and high_run.ended_at <= runs[1].started_at
        log = Path(low_trial.log_path or "").read_text()
    # The trial's log says why it stopped and that it continues.
    assert "preempted by trial" in log and "resumes from its latest checkpoint" in log, log[-3000:]
    assert_search_consistent(db)


def test_a_killed_driver_s_waiting_trials_leave_the_queue(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    cluster = _cluster_file(tmp_path, [1, 1])
    common = ["--db", db, "--cluster", str(cluster)]
    # Each trial takes both agents. The first low-priority one waits at its start,
    # holding them, until the other driver is dead, so the later ones still wait to be
    # placed then: the live driver's placement is what clears the dead driver's
    # reservation (a driver with nothing waiting places nothing), however fast or slowly
    # the machine runs either driver.
    gate = tmp_path / "high-killed"
    low = _experiment(
        tmp_path,
        "low",
        searcher=_search(trials=3, concurrent=2),
        data={"gate_file": str(gate), "slow_trials": [0]},
    )
    high = _experiment(
        tmp_path,
        "high",
        resources={"slots_per_trial": 2, "priority": 1},
        searcher=_search(trials=1, concurrent=1),
    )
    low_driver = start_cli(["run", str(low), *common], cli_env, tmp_path)
    wait_for(lambda: len(_starts(db, "low")) == 1, what="a low-priority trial running")
    high_driver = start_cli(["run", str(high), *common], cli_env, tmp_path)
    wait_for(lambda: bool(_queued_reasons(db, "high")), what="the priority-1 trial queued")
    # Its driver dies while the trial waits: after its heartbeat goes stale the trial
    # leaves the queue, and its reservation with it, so the other search goes on.
    high_driver.kill()
    high_driver.communicate(timeout=30)
    gate.touch()
    wait_for(
        lambda: not _queued_reasons(db, "high"), timeout=120, what="the dead driver's trial gone"
    )
    _finish(low_driver)
    assert len(_starts(db, "low")) == 3 and _starts(db, "high") == []
    # Resumed, the trial queues again and runs.
    resumed = run_cli(["resume", "high", *common, "--no-progress"], cli_env, tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(_starts(db, "high")) == 1
    assert_search_consistent(db)
