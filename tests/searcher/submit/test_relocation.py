"""``resume`` and ``continue`` on a database copied elsewhere: ``--relocate OLD=NEW`` moves
the stored folders, and a stored folder that no longer exists is refused (one line, exit
code 2, nothing written)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import select

from searcher.cli import main
from searcher.submit.relocation import Relocation
from searcher.submit.submission import validate_stored_run
from storage import Checkpoint, CheckpointState, Experiment, Trial, session_scope
from tests.searcher.conftest import run_cli, write_experiment


def _paths(db: str) -> list[str]:
    """Every path the database stores, model folder first."""
    with session_scope(db) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        paths = [experiment.model_dir, str(experiment.config_path)]
        paths += [str(p) for p in session.scalars(select(Trial.log_path).order_by(Trial.id))]
        paths += list(session.scalars(select(Checkpoint.path).order_by(Checkpoint.id)))
        return paths


def _copy_database(source: Path, target: Path) -> None:
    # SQLite's backup copies what the WAL file holds too, unlike copying the file.
    with sqlite3.connect(source) as old, sqlite3.connect(target) as new:
        old.backup(new)


def test_paths_under_the_longest_matching_prefix_move() -> None:
    moves = Relocation.parse(["/a=/x", "/a/b=/y"])
    assert moves.apply("/a/b/c") == "/y/c"
    assert moves.apply("/a/c") == "/x/c"
    assert moves.apply("/a") == "/x"
    assert moves.apply("/ab/c") == "/ab/c"


@pytest.mark.parametrize("text", ["nothing", "=/x", "/x=", "relative=/x"])
def test_a_malformed_relocation_is_one_line(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resume", "1", "--db", "sqlite:////nonexistent/x.db", "--relocate", text]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("--relocate: "), lines


@pytest.mark.slow
def test_a_copied_database_continues_in_its_new_folders(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    original = tmp_path / "original"
    path = write_experiment(
        original,
        searcher={"max_trials": 1, "max_concurrent_trials": 1},
        resources={"slots_per_trial": 1},
    )
    db_file = original / "search.db"
    first = run_cli(
        ["run", str(path), "--db", f"sqlite:///{db_file}", "--slots", "1", "--no-progress"],
        cli_env,
        original,
    )
    assert first.returncode == 0, first.stderr
    stored = _paths(f"sqlite:///{db_file}")
    assert all(p.startswith(str(original)) for p in stored), stored
    assert len(stored) >= 4, stored  # model, config, a trial's log, a checkpoint

    # The folder moves to another machine: only the copy is left.
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns("search.db*"))
    _copy_database(db_file, copy / "search.db")
    shutil.rmtree(original)
    db = f"sqlite:///{copy / 'search.db'}"
    before = _paths(db)
    with session_scope(db) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        state_before = (experiment.state, experiment.max_trials)

    refused = run_cli(["continue", "1", "--more-trials", "1", "--db", db], cli_env, copy)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, lines
    assert lines[0].startswith(f"experiment: 1's model folder {original} does not exist")
    assert "--relocate OLD=NEW" in lines[0]
    elsewhere = run_cli(
        ["continue", "1", "--more-trials", "1", "--db", db, "--relocate", f"{original}=/nowhere"],
        cli_env,
        copy,
    )
    assert elsewhere.returncode == 2 and elsewhere.stderr.startswith("--relocate: "), (
        elsewhere.stderr
    )
    assert _paths(db) == before
    with session_scope(db) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        assert (experiment.state, experiment.max_trials) == state_before
    assert not original.exists()

    extended = run_cli(
        [
            "continue",
            "1",
            "--more-trials",
            "1",
            "--db",
            db,
            "--slots",
            "1",
            "--no-progress",
            "--relocate",
            f"{original}={copy}",
        ],
        cli_env,
        copy,
    )
    assert extended.returncode == 0, extended.stderr
    assert "experiment 1 COMPLETED" in extended.stdout
    after = _paths(db)
    assert {p.replace(str(original), str(copy), 1) for p in before} <= set(after)
    assert all(p.startswith(str(copy)) for p in after), after
    # The trials' logs and their kept checkpoints are there (retention deleted the others).
    with session_scope(db) as session:
        kept = set(
            session.scalars(
                select(Checkpoint.path).where(Checkpoint.state == CheckpointState.COMPLETED)
            )
        )
        logs = set(session.scalars(select(Trial.log_path)))
    assert kept and all(Path(p).is_dir() for p in kept), kept
    assert len(logs) == 2 and all(Path(str(p)).is_file() for p in logs), logs
    assert not original.exists()
    # Later commands need no option: the database names the new folders.
    experiment_id, run = validate_stored_run("1", db, cluster_file=None, slots=1)
    assert experiment_id == 1 and run.config.searcher.max_trials == 2
