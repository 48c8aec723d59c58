"""The scheduler in real searches: multi-agent trials and two drivers sharing slots."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from sqlalchemy import select

from storage import (
    Experiment,
    Metric,
    MetricKind,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
)
from tests.searcher.conftest import run_cli, write_experiment

pytestmark = pytest.mark.slow


def test_two_agent_trial_trains_with_world_size_four(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "resource_pools": [
                    {
                        "name": "default",
                        "agents": [
                            {"name": "agent-a", "host": "127.0.0.1", "slots": 2},
                            {"name": "agent-b", "host": "127.0.0.1", "slots": 2},
                        ],
                    }
                ]
            }
        )
    )
    path = write_experiment(
        tmp_path / "exp",
        resources={"slots_per_trial": 4},
        searcher={"max_trials": 1, "pruner": {"name": "none"}, "max_length": {"epochs": 1}},
    )
    agents = run_cli(["agents", "--cluster", str(cluster)], cli_env, tmp_path)
    assert agents.returncode == 0 and "agent-a" in agents.stdout and "agent-b" in agents.stdout
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    result = run_cli(
        ["run", str(path), "--db", db, "--cluster", str(cluster), "--no-progress"],
        cli_env,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.COMPLETED, trial.error
        run = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial.id)).one()
        assert sorted(node["agent"] for node in run.agents) == ["agent-a", "agent-b"]
        names = set(
            session.scalars(
                select(Metric.name).where(
                    Metric.trial_id == trial.id, Metric.kind == MetricKind.VALIDATION
                )
            )
        )
        assert "val_loss" in names
        log = Path(trial.log_path or "").read_text()
    assert set(re.findall(r"^\[rank (\d+)\] ", log, flags=re.MULTILINE)) == {"0", "1", "2", "3"}
    assert len(re.findall(r"of world_size 4 ", log)) == 4, log[-3000:]
    assert {"agent-a", "agent-b"} <= set(re.findall(r"on agent (\S+)", log))


def test_two_drivers_racing_on_one_database_never_share_a_slot(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    drivers = []
    for name in ("first", "second"):
        path = write_experiment(
            tmp_path / name,
            name=name,
            searcher={"max_trials": 2, "pruner": {"name": "none"}, "max_length": {"epochs": 1}},
        )
        drivers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "searcher.cli",
                    "run",
                    str(path),
                    "--db",
                    db,
                    "--slots",
                    "2",
                    "--no-progress",
                ],
                env=cli_env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for driver in drivers:
        _, err = driver.communicate(timeout=600)
        assert driver.returncode == 0, err[-3000:]
    with session_scope(db) as session:
        runs = session.execute(select(TrialRun.started_at, TrialRun.ended_at)).all()
        states = set(session.scalars(select(Trial.state)))
    assert len(runs) == 4 and states <= {TrialState.COMPLETED, TrialState.PRUNED}
    # Every trial needs both slots of the only agent: no two runs may overlap in time.
    intervals = sorted((start, end) for start, end in runs)
    for (_, end), (next_start, _) in itertools.pairwise(intervals):
        assert end is not None and end <= next_start, intervals


def test_cost_aware_search_over_slots_per_trial_gives_a_pareto_front(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        searcher={
            "name": "nsga2",
            "objectives": [{"name": "slot_seconds"}],
            "pruner": {"name": "none"},
            "max_trials": 3,
            "max_concurrent_trials": 2,
            "max_length": {"epochs": 1},
        },
    )
    config = yaml.safe_load(path.read_text())
    config["hyperparameters"]["slots_per_trial"] = {"type": "categorical", "vals": [1, 2]}
    path.write_text(yaml.safe_dump(config))
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    result = run_cli(
        ["run", str(path), "--db", db, "--slots", "2", "--no-progress"], cli_env, tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with session_scope(db) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 3, [t.error for t in trials]
        for trial in trials:
            assert trial.slots_per_trial == trial.hparams["slots_per_trial"]
            run = session.scalars(select(TrialRun).where(TrialRun.trial_id == trial.id)).one()
            assert sum(len(node["slots"]) for node in run.agents) == trial.slots_per_trial
        study_name = session.scalars(select(Experiment.study_name)).one()
    study = optuna.load_study(study_name=study_name, storage=db)
    assert len(study.directions) == 2
    assert all(len(t.values) == 2 and t.values[1] > 0 for t in study.trials)
    by_number = {t.optuna_trial_number: t for t in trials}
    for frozen in study.trials:
        assert frozen.values[1] == pytest.approx(by_number[frozen.number].slot_seconds)
    assert study.best_trials, "no Pareto front"
