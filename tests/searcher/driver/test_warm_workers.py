"""Warm workers with real drivers and real torchrun jobs (``resources.reuse_workers``).

A trial on a warm job must see exactly what a cold start would show it: the same
seeded trial gives bit-identical metrics cold and warm, after a trial that changed
torch's global settings, the RNGs and a module global. A trial that fails ends its
warm job and the next starts cold; a driver killed while a warm job runs leaves
nothing behind after ``resume``.
"""

from __future__ import annotations

import itertools
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    Trial,
    TrialRun,
    TrialState,
    WarmJob,
    session_scope,
)
from tests.searcher.conftest import run_to_end, start_cli, wait_for
from tests.searcher.driver.test_fault_injection import _assert_no_process_left

pytestmark = pytest.mark.slow

MODEL = Path(__file__).parent / "_warm_model.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _experiment(
    folder: Path,
    *,
    seed: int,
    trials: int = 2,
    mutate_first: bool = False,
    epochs: int = 2,
    **resources: Any,
) -> Path:
    """A search of ``trials`` identical trials (one at a time, 2 slots each)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(MODEL, folder / "warm_model.py")
    data = resources.pop("data", {})
    config = {
        "name": folder.name,
        "entrypoint": "warm_model:MutatingTrial",
        "hyperparameters": {"global_batch_size": 32, "mutate_first": mutate_first},
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_trials": trials,
            "max_length": {"epochs": epochs},
            "max_concurrent_trials": 1,
            "seed": seed,
            "pruner": {"name": "none"},
        },
        "resources": {"slots_per_trial": 2, **resources},
        "min_validation_period": {"epochs": 1},
        "min_checkpoint_period": {"epochs": 1},
        "max_restarts": 1,
        "data": data,
    }
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _metrics(db: str, number: int) -> list[tuple[int, str, str, float | None]]:
    """Every metric row of trial ``number``: (step, kind, name, value), in order."""
    with session_scope(db) as session:
        trial = session.scalars(select(Trial).where(Trial.optuna_trial_number == number)).one()
        return [
            (row.step, row.kind.value, row.name, row.value)
            for row in session.scalars(
                select(Metric)
                .where(Metric.trial_id == trial.id)
                .order_by(Metric.step, Metric.kind, Metric.name)
            )
        ]


def _runs(db: str) -> list[TrialRun]:
    with session_scope(db) as session:
        return list(session.scalars(select(TrialRun).order_by(TrialRun.id)))


def test_a_seeded_trial_gives_bit_identical_metrics_cold_and_warm(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # Seeds are the experiment's seed plus the trial number: the warm search's trial 1
    # and the cold search's trial 0 train from the same seed.
    cold_db = f"sqlite:///{tmp_path / 'cold.db'}"
    cold = _experiment(tmp_path / "cold", seed=11, trials=1)
    run_to_end(["run", str(cold), "--db", cold_db, "--slots", "2"], cli_env, tmp_path)

    warm_db = f"sqlite:///{tmp_path / 'warm.db'}"
    warm = _experiment(tmp_path / "warm", seed=10, mutate_first=True, reuse_workers=True)
    run_to_end(["run", str(warm), "--db", warm_db, "--slots", "2"], cli_env, tmp_path)

    # Both warm trials ran on one job: one set of processes, two runs.
    runs = _runs(warm_db)
    assert len(runs) == 2 and runs[0].launch_token == runs[1].launch_token
    with session_scope(warm_db) as session:
        (job,) = session.scalars(select(WarmJob)).all()
        assert job.trials_run == 2 and job.ended_at is not None
        assert job.end_reason == "no trial of its shape waits"
        assert [t.state for t in session.scalars(select(Trial))] == [TrialState.COMPLETED] * 2
    expected = _metrics(cold_db, 0)
    assert expected and any(name == "noise" for _, _, name, _ in expected)
    assert _metrics(warm_db, 1) == expected
    # The cache is the one thing that crossed: trial 1 saw trial 0 there.
    # The log the trial's row names: in the warm search's own folder, though the cold
    # search's database, used from the same folder, also has an experiment 1.
    with session_scope(warm_db) as session:
        log_path = session.scalars(select(Trial.log_path).where(Trial.optuna_trial_number == 1))
        warm_log = Path(str(log_path.one()))
    with session_scope(cold_db) as session:
        cold_log = Path(str(session.scalars(select(Trial.log_path)).one()))
    assert cold_log.parent != warm_log.parent, (cold_log, warm_log)
    log = warm_log.read_text()
    assert "cache saw trials [0] before trial 1" in log
    # Imported afresh ahead of trial 1 (while trial 0's log was still open), by each rank:
    # what it printed then is in trial 1's log, before trial 1's own lines.
    for rank in (0, 1):
        imported = log.find(f"[rank {rank}] warm_model imported")
        assert -1 < imported < log.find(f"[rank {rank}] cache saw trials [0]"), log
    # The mutating trial itself trained on other numbers (the test can tell).
    assert _metrics(warm_db, 0) != expected

    # Keeping the module (opted in) lets its global through: the metrics differ.
    kept_db = f"sqlite:///{tmp_path / 'kept.db'}"
    kept = _experiment(
        tmp_path / "kept",
        seed=10,
        mutate_first=True,
        reuse_workers=True,
        keep_entrypoint_module=True,
    )
    run_to_end(["run", str(kept), "--db", kept_db, "--slots", "2"], cli_env, tmp_path)
    assert _metrics(kept_db, 1) != expected


def _example_experiment(
    folder: Path, config_path: Path, *, seed: int, trials: int, reuse_workers: bool
) -> Path:
    """An example's search with every hyperparameter at its first point (its trials
    differ by their seeds only), with dropout, 12 batches long, a validation and a
    checkpoint every 6, on one slot (two ranks of a warm job are the trials above)."""
    shutil.copytree(config_path.parent, folder, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load(config_path.read_text())
    fixed: dict[str, Any] = {}
    for name, value in config["hyperparameters"].items():
        if not isinstance(value, dict):
            fixed[name] = value
        elif value["type"] == "const":
            fixed[name] = value["val"]
        else:
            fixed[name] = value["vals"][0] if value["type"] == "categorical" else value["minval"]
    # Dropout draws from the RNGs every batch: a warm trial must see them seeded as cold.
    config["hyperparameters"] = {**fixed, "dropout": 0.1}
    config["searcher"].update(
        name="random",
        max_trials=trials,
        max_concurrent_trials=1,
        max_length={"batches": 12},
        seed=seed,
        pruner={"name": "none"},
    )
    config["resources"].update(slots_per_trial=1, reuse_workers=reuse_workers)
    config.update(min_validation_period={"batches": 6}, min_checkpoint_period={"batches": 6})
    path = folder / "search.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.parametrize("config", ["digits/experiment.yaml", "charlm/cpu.yaml"])
def test_an_example_gives_bit_identical_metrics_cold_and_warm(
    config: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    example = EXAMPLES / config
    cold_db = f"sqlite:///{tmp_path / 'cold.db'}"
    cold = _example_experiment(tmp_path / "cold", example, seed=11, trials=1, reuse_workers=False)
    run_to_end(["run", str(cold), "--db", cold_db, "--slots", "2"], cli_env, tmp_path)
    warm_db = f"sqlite:///{tmp_path / 'warm.db'}"
    warm = _example_experiment(tmp_path / "warm", example, seed=10, trials=2, reuse_workers=True)
    run_to_end(["run", str(warm), "--db", warm_db, "--slots", "2"], cli_env, tmp_path)

    runs = _runs(warm_db)
    assert len(runs) == 2 and runs[0].launch_token == runs[1].launch_token
    expected = _metrics(cold_db, 0)
    assert any(kind == "validation" for _, kind, _, _ in expected), expected
    assert _metrics(warm_db, 1) == expected


def test_a_failing_trial_ends_its_warm_job_and_the_next_starts_cold(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    path = _experiment(
        tmp_path / "exp", seed=3, trials=3, reuse_workers=True, data={"fail_trial": 1}
    )
    path_config = yaml.safe_load(path.read_text())
    path_config["max_restarts"] = 0
    path.write_text(yaml.safe_dump(path_config, sort_keys=False))
    run_to_end(["run", str(path), "--db", db, "--slots", "2"], cli_env, tmp_path)
    with session_scope(db) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.optuna_trial_number)))
        assert [t.state for t in trials] == [
            TrialState.COMPLETED,
            TrialState.ERROR,
            TrialState.COMPLETED,
        ]
        assert trials[1].error and "fails on purpose" in trials[1].error
        jobs = list(session.scalars(select(WarmJob).order_by(WarmJob.id)))
    runs = _runs(db)
    # Trials 0 and 1 shared a job; trial 1's failure ended it; trial 2 started a new one.
    assert runs[0].launch_token == runs[1].launch_token != runs[2].launch_token
    assert len(jobs) == 2 and all(job.ended_at is not None for job in jobs)
    assert jobs[0].end_reason is not None and "exited" in jobs[0].end_reason
    assert jobs[0].trials_run == 1 and jobs[1].trials_run == 1
    _assert_no_process_left(db)


def test_two_trials_at_once_keep_their_two_jobs_for_the_whole_search(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    # Hand-backs land at any moment of the driver's tick: a placement decision may see a
    # job idle (and reserve it) before its driver has reaped the hand-back. Neither may
    # end the job: every trial after the first two runs warm.
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    path = _experiment(tmp_path / "exp", seed=5, trials=12, epochs=1, reuse_workers=True)
    config = yaml.safe_load(path.read_text())
    config["resources"]["slots_per_trial"] = 1
    config["searcher"]["max_concurrent_trials"] = 2
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_to_end(["run", str(path), "--db", db, "--slots", "2"], cli_env, tmp_path)
    with session_scope(db) as session:
        states = session.scalars(select(Trial.state)).all()
        jobs = list(session.scalars(select(WarmJob).order_by(WarmJob.id)))
        assert states == [TrialState.COMPLETED] * 12
    runs = _runs(db)
    seen = [
        (job.id, job.trials_run, job.end_requested_at, job.end_reason, job.ended_at)
        for job in jobs
    ]
    assert len(jobs) == 2 and len({run.launch_token for run in runs}) == 2, seen
    # Neither was asked to end before the last trial was handed to it. (Once the last
    # trial is decided ahead for one job, the other, idle, ends: nothing else waits.)
    last_start = {
        job.launch_token: max(
            run.started_at for run in runs if run.launch_token == job.launch_token
        )
        for job in jobs
    }
    assert all(
        job.end_requested_at is not None
        and job.end_requested_at >= last_start[job.launch_token]
        and job.ended_at is not None
        for job in jobs
    ), (seen, last_start)
    assert sum(job.trials_run for job in jobs) == 12, seen
    # Rank 0 started trials decided ahead itself, in the hand-back of the trial before
    # (its run starts before the driver recorded that hand-back).
    by_job: dict[str | None, list[TrialRun]] = {}
    for run in runs:
        by_job.setdefault(run.launch_token, []).append(run)
    taken_by_rank_0 = [
        after.trial_id
        for job_runs in by_job.values()
        for before, after in itertools.pairwise(job_runs)
        if before.ended_at is not None and after.started_at < before.ended_at
    ]
    assert taken_by_rank_0, [(r.trial_id, r.started_at, r.ended_at) for r in runs]
    _assert_no_process_left(db)


def test_resume_after_a_killed_driver_ends_its_warm_job_and_runs_nothing_twice(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    # The second trial's first attempt takes about 16 s: the driver is killed while it
    # trains on the warm job, once it has a checkpoint to go on from. The other trials,
    # and that trial's next attempt, train at full speed.
    path = _experiment(
        tmp_path / "exp",
        seed=5,
        trials=3,
        epochs=8,
        reuse_workers=True,
        data={"batch_delay_s": 0.25, "slow_trials": [1], "fast_from_attempt": 1},
    )
    driver = start_cli(["run", str(path), "--db", db, "--slots", "2"], cli_env, tmp_path)

    def second_trial_checkpointed_on_the_warm_job() -> bool:
        runs = _runs(db)
        if len(runs) < 2:
            return False
        with session_scope(db) as session:
            return bool(
                session.scalar(
                    select(func.count()).where(
                        Checkpoint.trial_id == runs[1].trial_id,
                        Checkpoint.state == CheckpointState.COMPLETED,
                    )
                )
            )

    wait_for(
        second_trial_checkpointed_on_the_warm_job,
        what="the second trial to checkpoint on the warm job",
    )
    with session_scope(db) as session:
        first = session.scalars(select(Trial).where(Trial.optuna_trial_number == 0)).one()
        first_end = first.ended_at
        assert first.state == TrialState.COMPLETED
        # The third trial was asked ahead for the warm job, and waits unlaunched, decided
        # ahead as the job's next.
        third = session.scalars(select(Trial).where(Trial.optuna_trial_number == 2)).one()
        assert third.state == TrialState.QUEUED and not third.runs
        (job,) = session.scalars(select(WarmJob)).all()
        assert job.ahead_trial_id == third.id
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=30)

    run_to_end(["resume", path.parent.name, "--db", db, "--slots", "2"], cli_env, tmp_path)
    with session_scope(db) as session:
        experiment = session.scalars(select(Experiment)).one()
        assert experiment.state == ExperimentState.COMPLETED
        trials = list(session.scalars(select(Trial).order_by(Trial.optuna_trial_number)))
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 3
        # The finished trial was not run again.
        assert trials[0].ended_at == first_end
        assert len(trials[0].runs) == 1
        # The interrupted trial went on cold from its checkpoint; its old job was ended.
        assert len(trials[1].runs) == 2
        assert trials[1].runs[1].restored_from_step
        assert trials[1].runs[0].launch_token == trials[0].runs[0].launch_token
        jobs = list(session.scalars(select(WarmJob).order_by(WarmJob.id)))
        assert jobs[0].end_reason == "driver stopped; its trial continues cold"
        assert all(job.ended_at is not None for job in jobs)
    _assert_no_process_left(db)
