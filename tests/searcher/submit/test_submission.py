"""A run is validated once, at submission: every refusal is one line, exit code 2, nothing
written; the driver runs what was validated, through the run's one executor.

Refusals go through ``searcher.cli.main``, the function the ``slotsweep`` console script
calls, in this process; ``tests/searcher/cli/test_errors.py`` runs some of them through real processes.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

import searcher.submit.samplers as samplers
from searcher.cli import main
from searcher.driver.driver import SearchDriver
from searcher.experiments import UsageError
from searcher.submit.creation import create_experiment
from searcher.submit.submission import ValidatedRun, validate_run, validate_stored_run
from storage import Experiment, ExperimentState, Trial, TrialRun, session_scope
from tests.conftest import REPO_ROOT
from tests.searcher.conftest import write_experiment
from trials.config import load_config
from trials.executors import LaunchRequest, LocalExecutor, parse_cluster
from trials.scheduler import Cluster, local_cluster

_AWAY_HOST = "gpu-node-17.example.org"


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The user's database, cluster and log folder must not decide what these tests see.
    monkeypatch.delenv("SLOTSWEEP_DB", raising=False)
    monkeypatch.delenv("SLOTSWEEP_CLUSTER", raising=False)
    monkeypatch.setenv("SLOTSWEEP_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.chdir(tmp_path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    """Run the CLI; assert exit code 2 with one line naming ``needles``; return that line."""
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (captured.out, captured.err)
    assert len(lines) == 1, lines
    assert "Traceback" not in captured.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _cluster_file(folder: Path, *agents: dict[str, object]) -> Path:
    path = folder / "cluster.yaml"
    pool = {"name": "default", "agents": list(agents)}
    path.write_text(yaml.safe_dump({"resource_pools": [pool]}))
    return path


def _away_cluster(folder: Path) -> Path:
    """One agent on this machine and one on another host (the local executor reaches one)."""
    return _cluster_file(
        folder,
        {"name": "here", "host": "127.0.0.1", "slots": 1},
        {"name": "away", "host": _AWAY_HOST, "slots": 1},
    )


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ----------------------------------------------------------------- refusals of a new run


def test_each_refusal_of_a_new_run_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = write_experiment(tmp_path / "exp", resources={"slots_per_trial": 1})
    bad_field = write_experiment(tmp_path / "bad", searcher={"name": "bayes"})
    too_big = write_experiment(tmp_path / "big", resources={"slots_per_trial": 3})
    other_pool = write_experiment(
        tmp_path / "pool", resources={"slots_per_trial": 1, "resource_pool": "gpus"}
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("resource_pools: [{name: default, agents: [{name: a, slots: -1}]}]\n")
    away = _away_cluster(tmp_path)
    db = tmp_path / "out.db"
    before = _listing(tmp_path)
    refusals: list[tuple[list[str], tuple[str, ...]]] = [
        # config
        ([str(bad_field)], ("searcher.name", "tpe")),
        # cluster file
        ([str(experiment), "--cluster", str(broken)], ("cluster", "slots")),
        # schedulability
        ([str(too_big), "--slots", "2"], ("slots_per_trial=3", "valid slots_per_trial")),
        ([str(other_pool), "--slots", "2"], ("resources.resource_pool", "gpus", "pools: default")),
        # an agent the executor cannot reach
        ([str(experiment), "--cluster", str(away)], ("agent 'away'", _AWAY_HOST, "local")),
        # database
        ([str(experiment), "--db", "nonsense"], ("--db",)),
    ]
    for argv, needles in refusals:
        database = [] if "--db" in argv else ["--db", f"sqlite:///{db}"]
        _refused(["run", *argv, *database], capsys, *needles)
    assert _listing(tmp_path) == before
    assert not db.exists()


@pytest.mark.slow  # starts a Python process that imports torch
def test_an_entrypoint_that_does_not_load_is_refused_before_the_database_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_experiment(tmp_path / "exp", entrypoint="model:NoSuchTrial")
    db = tmp_path / "out.db"
    _refused(["run", str(path), "--db", f"sqlite:///{db}", "--slots", "2"], capsys, "entrypoint")
    assert not db.exists()


def test_the_executors_refusals_name_the_field(tmp_path: Path) -> None:
    # The Slurm executors need a Slurm cluster to reach through the CLI (test_slurm*.py);
    # their objections are the validation's own, checked here on clusters built directly.
    config = load_config(write_experiment(tmp_path / "exp", resources={"slots_per_trial": 1}))
    pool = local_cluster(2).pools
    jobs = Cluster(pools=pool, executor="sbatch")
    with pytest.raises(UsageError, match=r"^database: SQLite cannot be shared by the sbatch"):
        validate_run(config, jobs, f"sqlite:///{tmp_path / 'x.db'}")
    warm = config.model_copy(
        update={"resources": config.resources.model_copy(update={"reuse_workers": True})}
    )
    with pytest.raises(UsageError, match=r"^resources.reuse_workers: not available"):
        validate_run(warm, jobs, "postgresql+psycopg://u@127.0.0.1/db")
    # A Slurm allocation's nodes are other hosts, and its executor reaches them.
    nodes = parse_cluster(
        {
            "resource_pools": [
                {"name": "default", "agents": [{"name": "n1", "host": _AWAY_HOST, "slots": 2}]}
            ]
        }
    )
    slurm = Cluster(pools=nodes.pools, executor="slurm")
    run = validate_run(config, slurm, "postgresql+psycopg://u@127.0.0.1/db")
    assert run.pool.agents[0].host == _AWAY_HOST


def test_bad_shares_of_a_slot_are_refused_naming_the_allowed_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 52: 0.3, 1.5, a share with a search over slots_per_trial, and a share on an
    executor that cannot honour it: one line each, exit 2, nothing written."""
    allowed = "0.5, 0.25 or 0.125"
    third = write_experiment(tmp_path / "third", resources={"slots_per_trial": 0.3})
    one_and_a_half = write_experiment(tmp_path / "oah", resources={"slots_per_trial": 1.5})
    searched = write_experiment(tmp_path / "searched", resources={"slots_per_trial": 0.25})
    yaml_text = yaml.safe_load(searched.read_text())
    yaml_text["hyperparameters"]["slots_per_trial"] = {"type": "categorical", "vals": [1, 2]}
    searched.write_text(yaml.safe_dump(yaml_text))
    searched_shares = write_experiment(tmp_path / "shares")
    yaml_text = yaml.safe_load(searched_shares.read_text())
    yaml_text["hyperparameters"]["slots_per_trial"] = {"type": "categorical", "vals": [0.25, 1]}
    searched_shares.write_text(yaml.safe_dump(yaml_text))
    db = tmp_path / "out.db"
    before = _listing(tmp_path)
    refusals: list[tuple[Path, tuple[str, ...]]] = [
        (third, ("resources.slots_per_trial", allowed, "(got 0.3)")),
        (one_and_a_half, ("resources.slots_per_trial", allowed, "(got 1.5)")),
        (searched, ("resources.slots_per_trial", "0.25", "hyperparameters.slots_per_trial")),
        (searched_shares, ("hyperparameters.slots_per_trial", "0.25", allowed)),
    ]
    for path, needles in refusals:
        _refused(["run", str(path), "--db", f"sqlite:///{db}", "--slots", "2"], capsys, *needles)
    assert _listing(tmp_path) == before
    assert not db.exists()


def test_a_share_on_an_executor_that_cannot_honour_it_is_refused(tmp_path: Path) -> None:
    config = load_config(write_experiment(tmp_path / "exp", resources={"slots_per_trial": 0.25}))
    assert config.resources.slots_per_trial == 0.25 and config.resources.slots == 1
    # The local executor places processes on the ledger's slots: a share runs there.
    run = validate_run(config, local_cluster(1), f"sqlite:///{tmp_path / 'x.db'}")
    assert run.slots_per_trial == (1,)
    nodes = parse_cluster(
        {
            "resource_pools": [
                {"name": "default", "agents": [{"name": "n1", "host": _AWAY_HOST, "slots": 2}]}
            ]
        }
    )
    for executor in ("slurm", "sbatch"):
        cluster = Cluster(pools=nodes.pools, executor=executor)
        with pytest.raises(UsageError) as refused:
            validate_run(config, cluster, "postgresql+psycopg://u@127.0.0.1/db")
        (line,) = str(refused.value).splitlines()
        assert line.startswith("resources.slots_per_trial: a share of one slot (0.25)")
        assert f"executor ({executor})" in line and "whole number of slots (1, 2, ...)" in line


# ----------------------------------------------------------------- refusals of a stored run


def _stored_experiment(tmp_path: Path, db: str) -> int:
    """An experiment created as ``slotsweep run --detach`` creates it (no driver ran)."""
    path = write_experiment(tmp_path / "exp", resources={"slots_per_trial": 1})
    config = load_config(path)
    return create_experiment(
        config, config_path=path, db_url=db, directions=samplers.study_directions(config)
    )


def _database_record(db: str) -> tuple[object, ...]:
    with session_scope(db) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        trials = session.scalar(select(func.count()).select_from(Trial))
        runs = session.scalar(select(func.count()).select_from(TrialRun))
        experiments = session.scalar(select(func.count()).select_from(Experiment))
        return (
            experiments,
            experiment.state,
            experiment.max_trials,
            experiment.config,
            experiment.driver_pid,
            trials,
            runs,
        )


@pytest.mark.parametrize("command", [["resume"], ["activate"], ["continue", "--more-trials", "2"]])
def test_an_agent_on_another_host_is_refused_before_a_stored_run_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'search.db'}"
    experiment_id = _stored_experiment(tmp_path, db)
    away = _away_cluster(tmp_path)
    before = _database_record(db)
    files = _listing(tmp_path)
    name, *options = command
    line = _refused(
        [name, str(experiment_id), *options, "--db", db, "--cluster", str(away)],
        capsys,
        "agent 'away'",
    )
    assert line.startswith("cluster: ")
    assert _database_record(db) == before
    assert before[1] == ExperimentState.ACTIVE
    assert _listing(tmp_path) == files


def test_a_stored_run_that_no_longer_fits_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'search.db'}"
    experiment_id = _stored_experiment(tmp_path, db)
    before = _database_record(db)
    elsewhere = tmp_path / "gpus.yaml"
    elsewhere.write_text("resource_pools: [{name: gpus, agents: [{name: a, slots: 1}]}]\n")
    for command in (["resume"], ["continue", "--max-trials", "5"]):
        name, *options = command
        _refused(
            [name, str(experiment_id), *options, "--db", db, "--cluster", str(elsewhere)],
            capsys,
            "resources.resource_pool: unknown resource pool 'default'; pools: gpus",
        )
    assert _database_record(db) == before


# ----------------------------------------------------------------- the driver and the run


class _UnstartableExecutor(LocalExecutor):
    """The local executor on a machine where starting processes fails (fork refused)."""

    def launch(self, request: LaunchRequest) -> object:  # type: ignore[override]
        raise OSError("cannot fork:\nresource temporarily unavailable")


def _validated(tmp_path: Path, db: str) -> tuple[int, ValidatedRun]:
    experiment_id = _stored_experiment(tmp_path, db)
    return validate_stored_run(str(experiment_id), db, cluster_file=None, slots=2)


def test_the_driver_runs_the_validated_run_through_its_one_executor(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'search.db'}"
    experiment_id, run = _validated(tmp_path, db)
    driver = SearchDriver(experiment_id, run, show_progress=False)
    assert driver.ctx.executor is run.executor
    assert (driver.ctx.config, driver.ctx.pool, driver.ctx.db_url) == (
        run.config,
        run.pool,
        run.db_url,
    )
    assert run.slots_per_trial == (1,)


def test_a_launch_failure_is_printed_by_the_driver_as_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = f"sqlite:///{tmp_path / 'search.db'}"
    experiment_id, run = _validated(tmp_path, db)
    unstartable = replace(run, executor=_UnstartableExecutor(use_gpus=False))
    with caplog.at_level(logging.WARNING, logger="searcher.driver.driver"):
        SearchDriver(experiment_id, unstartable, show_progress=False).run()
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    why = "launch failed: cannot fork: resource temporarily unavailable"
    assert failures[:2] == [
        f"trial {experiment_id}.0 failed: {why}",
        f"trial {experiment_id}.1 failed: {why}",
    ]
    with session_scope(db) as session:
        errors = list(session.scalars(select(Trial.error).order_by(Trial.id)))
    assert errors == [why, why]


# ----------------------------------------------------------------- one executor per run


def _calls_of(function: str) -> list[str]:
    """``path:function`` of every call of ``function`` in the product's packages."""
    found = []
    for package in ("searcher", "trials", "storage", "ui"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef):
                    continue
                for call in ast.walk(node):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and call.func.id == function
                    ):
                        found.append(f"{path.relative_to(REPO_ROOT)}:{node.name}")
    return found


def test_a_run_builds_its_executor_once() -> None:
    # validate_new_run goes through validate_run; resume and continue through
    # validate_stored_run: each builds the run's executor once, and nothing else does.
    assert sorted(_calls_of("executor_for")) == [
        "searcher/submit/submission.py:validate_run",
        "searcher/submit/submission.py:validate_stored_run",
    ]


# ------------------------------------------------- the example's size follows the machine


def test_the_example_shrinks_to_one_slot_and_says_so_and_keeps_two_where_they_exist(
    tmp_path: Path,
) -> None:
    example = REPO_ROOT / "examples" / "digits" / "experiment.yaml"
    one = validate_run(load_config(example), local_cluster(1), f"sqlite:///{tmp_path / 'a.db'}")
    assert one.config.resources.slots_per_trial == 1 and one.slots_per_trial == (1,)
    assert one.notes == (
        "resources.slots_per_trial: 2 cannot be placed in resource pool 'default'; "
        "shrink_to_fit: each trial runs on 1 slot(s), the most it can",
    )
    two = validate_run(load_config(example), local_cluster(2), f"sqlite:///{tmp_path / 'b.db'}")
    assert two.config.resources.slots_per_trial == 2 and two.notes == ()
    eight = validate_run(load_config(example), local_cluster(8), f"sqlite:///{tmp_path / 'c.db'}")
    assert eight.config.resources.slots_per_trial == 2 and eight.notes == ()


def test_without_shrink_to_fit_a_size_that_cannot_be_placed_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact = write_experiment(tmp_path / "exp")  # the example's 2 slots, shrink_to_fit off
    db = tmp_path / "out.db"
    _refused(
        ["run", str(exact), "--slots", "1", "--db", f"sqlite:///{db}"],
        capsys,
        "slots_per_trial=2",
        "valid slots_per_trial: 1",
    )
    assert not db.exists()
