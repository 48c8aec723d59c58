"""A port taken before a trial starts costs it no restart: it starts again at once, fresh ports.

torchrun picks its ports free a moment before they are bound, so on a busy machine
another process can take one first. The tests take it for real: a ``sitecustomize``
on the trials' ``PYTHONPATH`` (``_port_thief``) binds the port the first attempt was
given, in the process about to bind it: rank 0's ``MASTER_PORT`` (every trial,
cold or warm) or the rendezvous port of a trial across two agents (torchrun's own).
The Slurm executors are covered by
``tests/searcher/test_slurm_jobs.py::test_each_trial_is_a_job_of_its_own_and_one_of_four_slots_takes_both_nodes``.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
import yaml
from sqlalchemy import select

from searcher.driver.failures import FailureRecord, judge_run
from searcher.driver.outcomes import PORT_CLASH_NOTE
from storage import (
    Experiment,
    Trial,
    TrialFailure,
    TrialRun,
    TrialState,
    optuna_storage,
    session_scope,
)
from tests.searcher.conftest import (
    executor_args,
    executor_resources,
    run_to_end,
    write_experiment,
)

pytestmark = pytest.mark.slow

THIEF = Path(__file__).parent / "_port_thief"
ONE_SHORT_TRIAL = {"max_trials": 1, "max_length": {"epochs": 1}, "pruner": {"name": "none"}}


def taking_env(cli_env: dict[str, str], mode: str, marker: Path) -> dict[str, str]:
    """``cli_env`` with the port thief on the path, taking the ``mode`` port once."""
    paths = [str(THIEF), cli_env.get("PYTHONPATH", "")]
    return {
        **cli_env,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "SLOTSWEEP_TEST_TAKE_PORT": f"{mode}:{marker}",
    }


def assert_started_again_without_a_restart(db: str, output: str, marker: Path) -> None:
    """One trial, COMPLETED with no restart in two attempts, the first a port clash."""
    taken = int(marker.read_text())
    seen = [int(line) for line in Path(f"{marker}.seen").read_text().split()]
    # The first attempt was given the taken port, the second another one.
    assert len(seen) == 2 and seen[0] == taken and seen[1] != taken, seen
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert trial.state == TrialState.COMPLETED, trial.error
        assert trial.restarts == 0 and trial.error is None
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        assert [run.attempt for run in runs] == [0, 1]
        assert runs[0].reason == PORT_CLASH_NOTE
        rows = list(
            session.scalars(
                select(TrialFailure).order_by(TrialFailure.recorded_at, TrialFailure.id)
            )
        )
        assert {row.run_id for row in rows} == {runs[0].id}, [r.message for r in rows]
        records = [
            FailureRecord(r.rank, r.exception_type, r.message, r.steps_completed) for r in rows
        ]
        verdict = judge_run(records, world_size=trial.slots_per_trial)
        assert verdict is not None and verdict.port_clash, records
        assert any(f"port: {taken}," in record.message for record in records), records
        study_name = session.scalars(select(Experiment.study_name)).one()
        log = Path(trial.log_path or "").read_text()
    label = "trial 1.0"
    assert f"{label}: {PORT_CLASH_NOTE}" in output, output[-3000:]
    assert f"[slotsweep] {label}: {PORT_CLASH_NOTE}" in log, log[-3000:]
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]


def test_rank_0s_master_port_taken_starts_the_trial_again_with_no_restart(
    tmp_path: Path, cli_env: dict[str, str], executor: str
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        searcher=ONE_SHORT_TRIAL,
        resources=executor_resources(executor),
        max_restarts=0,
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    marker = tmp_path / "taken-port"
    output = run_to_end(
        ["run", str(path), "--db", db, *executor_args(executor)],
        taking_env(cli_env, "master", marker),
        tmp_path,
    )
    assert_started_again_without_a_restart(db, output, marker)


def test_a_taken_rendezvous_port_starts_a_two_agent_trial_again_with_no_restart(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    cluster = tmp_path / "cluster.yaml"
    agents = [{"name": f"agent-{n}", "host": "127.0.0.1", "slots": 1} for n in "ab"]
    cluster.write_text(yaml.safe_dump({"resource_pools": [{"name": "default", "agents": agents}]}))
    path = write_experiment(
        tmp_path / "exp",
        searcher=ONE_SHORT_TRIAL,
        resources={"slots_per_trial": 2},
        max_restarts=0,
    )
    db = f"sqlite:///{tmp_path / 'sweep.db'}"
    marker = tmp_path / "taken-port"
    output = run_to_end(
        ["run", str(path), "--db", db, "--cluster", str(cluster)],
        taking_env(cli_env, "rdzv", marker),
        tmp_path,
    )
    assert_started_again_without_a_restart(db, output, marker)
    with session_scope(db) as session:
        (failure,) = session.scalars(select(TrialFailure))
        # torchrun failed before starting any rank, and recorded it itself.
        assert failure.rank == TrialFailure.TORCHRUN_RANK
        assert failure.exception_type == "DistNetworkError"
