"""Share trials in real searches (issue 52, item 7): CPU slots are processes, so shares of
one slot are several trials' processes on one slot at once.

- Two 0.5-share trials of one search run at once on one slot and both complete; a third
  waits (its queue row says why) until one of them has ended.
- A share trial and a whole-slot trial of two searches on one database never share a slot.
- A resume after the driver was SIGKILLed ends the share trials it left and continues
  them from their checkpoints, as it does whole-slot trials; nothing runs twice.
Each ends with the consistency check, whose slot overlaps count claims above a slot's
capacity.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from storage import (
    Allocation,
    Experiment,
    ExperimentState,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    open_runs,
    start_cli,
    torchrun_pids,
    wait_for,
    write_experiment,
)
from trials.coordination import cluster_queue

pytestmark = pytest.mark.slow


def _share_experiment(
    folder: Path, share: float, trials: int, *, epochs: int = 2, warm: bool = False, **data: Any
) -> Path:
    """The slow digits trial on ``share`` of a slot: ``trials`` trials, all at once."""
    return write_experiment(
        folder,
        name=folder.name,
        entrypoint="slow_model:SlowDigitsTrial",
        hyperparameters={"global_batch_size": 64},
        data={"batch_delay_s": 0.02, **data},
        searcher={
            "max_trials": trials,
            "max_concurrent_trials": trials,
            "max_length": {"epochs": epochs},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": share, "reuse_workers": warm},
    )


def _runs(db: str) -> list[tuple[int, TrialRun]]:
    """Every run with its trial's Optuna number, oldest first."""
    with session_scope(db) as session:
        rows = session.execute(
            select(Trial.optuna_trial_number, TrialRun)
            .join(TrialRun, TrialRun.trial_id == Trial.id)
            .order_by(TrialRun.id)
        ).all()
        session.expunge_all()
    return [(number, run) for number, run in rows]


def _overlap(first: TrialRun, second: TrialRun) -> bool:
    end = dt.datetime.max
    return first.started_at < (second.ended_at or end) and second.started_at < (
        first.ended_at or end
    )


def _slots_of(run: TrialRun) -> set[tuple[str, int]]:
    return {(node["agent"], slot) for node in run.agents for slot in node["slots"]}


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_two_halves_run_at_once_on_one_slot_and_a_third_waits(
    tmp_path: Path, cli_env: dict[str, str], warm: bool
) -> None:
    """Warm: the third runs on the job of the half that ended (a job of a share's shape)."""
    gate = tmp_path / "gate"
    path = _share_experiment(tmp_path / "halves", 0.5, 3, warm=warm, gate_file=str(gate))
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    driver = start_cli(["run", str(path), "--db", db, "--slots", "1"], cli_env, tmp_path)

    def third_waits() -> bool:
        with session_scope(db) as session:
            views = cluster_queue.queue_view(session)
        return len(open_runs(db)) == 2 and [(v.trial_number, v.reason) for v in views] == [
            (2, "no slot in pool default has 1/2 of a slot free")
        ]

    # The first two hold their halves at the gate; the third waits for room.
    wait_for(third_waits, what="two halves running and the third waiting")
    with session_scope(db) as session:
        held = session.execute(select(Allocation.slot, Allocation.eighths)).all()
    assert sorted(held) == [(0, 4), (0, 4)]
    gate.touch()
    _, err = driver.communicate(timeout=600)
    assert driver.returncode == 0, err[-4000:]

    runs = _runs(db)
    assert [number for number, _ in runs] == [0, 1, 2]
    (_, first), (_, second), (_, third) = runs
    assert all(_slots_of(run) == {(run.agents[0]["agent"], 0)} for _, run in runs)
    # Both halves trained at once; the third started only once one of them had ended:
    # cold, after the driver saw a run end; warm, on the job of a half that handed it
    # back (its rank 0 may start it before the driver records that run's end).
    assert _overlap(first, second)
    assert first.ended_at is not None and second.ended_at is not None
    tokens = [run.launch_token for _, run in runs]
    assert (tokens[2] in tokens[:2]) is warm
    if not warm:
        assert third.started_at >= min(first.ended_at, second.ended_at)
    with session_scope(db) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert session.scalars(select(Allocation)).all() == []
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 3
    # Slot-seconds count each trial at its share: half its time on the slot.
    for trial, (_, run) in zip(trials, runs, strict=True):
        assert run.ended_at is not None and trial.slot_seconds is not None
        assert 0 < trial.slot_seconds <= 0.5 * (run.ended_at - run.started_at).total_seconds()
    assert_search_consistent(db)


def test_a_share_trial_and_a_whole_trial_never_share_a_slot(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    shares = _share_experiment(tmp_path / "quarters", 0.25, 4)
    whole = write_experiment(
        tmp_path / "whole",
        name="whole",
        entrypoint="slow_model:SlowDigitsTrial",
        hyperparameters={"global_batch_size": 64},
        data={"batch_delay_s": 0.02},
        searcher={"max_trials": 3, "max_length": {"epochs": 2}, "pruner": {"name": "none"}},
        resources={"slots_per_trial": 1},
    )
    drivers = [
        start_cli(["run", str(path), "--db", db, "--slots", "2"], cli_env, tmp_path)
        for path in (shares, whole)
    ]
    for driver in drivers:
        _, err = driver.communicate(timeout=900)
        assert driver.returncode == 0, err[-4000:]
    with session_scope(db) as session:
        share_experiment = session.scalars(
            select(Experiment.id).where(Experiment.name == "quarters")
        ).one()
        kinds = dict(session.execute(select(Trial.id, Trial.experiment_id)).all())
    runs = [run for _, run in _runs(db)]
    quarters = [r for r in runs if kinds[r.trial_id] == share_experiment]
    wholes = [r for r in runs if kinds[r.trial_id] != share_experiment]
    assert len(quarters) == 4 and len(wholes) == 3
    # Quarters packed onto one slot: some ran at once on the same slot.
    assert any(
        _overlap(a, b) and _slots_of(a) == _slots_of(b)
        for i, a in enumerate(quarters)
        for b in quarters[i + 1 :]
    )
    for share_run in quarters:
        for whole_run in wholes:
            if _overlap(share_run, whole_run):
                assert not _slots_of(share_run) & _slots_of(whole_run)
    assert_search_consistent(db)


def test_a_resume_after_a_driver_kill_continues_share_trials_as_whole_ones(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # Slow until the kill (4 epochs of about 5 s), fast once continued.
    path = _share_experiment(
        tmp_path / "halves", 0.5, 2, batch_delay_s=0.2, fast_from_attempt=1, epochs=4
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    common = ["--db", db, "--slots", "1"]
    driver = start_cli(["run", str(path), *common], cli_env, tmp_path)
    wait_for(
        lambda: (
            len(open_runs(db)) == 2
            and completed_checkpoints(db) >= 1
            and all("pid" in node for run in open_runs(db) for node in run.agents)
        ),
        what="both halves running, one checkpointed",
    )
    left = {run.id for run in open_runs(db)}
    leftover = torchrun_pids(db)
    driver.kill()
    driver.communicate(timeout=30)
    # The dead driver's share trials train on, holding their halves.
    assert leftover and all(psutil.pid_exists(pid) for pid in leftover)
    with session_scope(db) as session:
        assert sorted(session.scalars(select(Allocation.eighths))) == [4, 4]

    resume = start_cli(["resume", "halves", *common], cli_env, tmp_path)
    _, err = resume.communicate(timeout=900)
    assert resume.returncode == 0, err[-4000:]
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in leftover
    )
    runs = [run for _, run in _runs(db)]
    ended_by_resume = [run for run in runs if run.id in left]
    assert len(ended_by_resume) == 2
    assert all("driver stopped" in (run.reason or "") for run in ended_by_resume)
    later = [run for run in runs if run.id not in left]
    # Each continued as a half of the one slot again, one of them from its checkpoint.
    assert {run.trial_id for run in later} == {run.trial_id for run in ended_by_resume}
    assert all(_slots_of(run) == _slots_of(ended_by_resume[0]) for run in later)
    assert any((run.restored_from_step or 0) > 0 for run in later)
    with session_scope(db) as session:
        states = set(session.scalars(select(Trial.state)))
        experiment = session.scalars(select(Experiment)).one()
        assert session.scalars(select(Allocation)).all() == []
    assert states == {TrialState.COMPLETED}
    assert experiment.state == ExperimentState.COMPLETED
    assert_search_consistent(db)
