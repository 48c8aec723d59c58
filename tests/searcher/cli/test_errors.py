"""Bad input: one line per problem naming the field, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.searcher.conftest import run_cli, write_experiment

# Each test starts the CLI as a real process.
pytestmark = pytest.mark.slow


def _assert_usage_error(result: object, *needles: str) -> list[str]:
    assert result.returncode == 2, (result.stdout, result.stderr)  # type: ignore[attr-defined]
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert lines, "no message"
    assert "Traceback" not in result.stderr  # type: ignore[attr-defined]
    for needle in needles:
        assert any(needle in line for line in lines), (needle, lines)
    return lines


def test_invalid_config_lists_each_problem_and_writes_nothing(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(tmp_path / "exp")
    config = yaml.safe_load(path.read_text())
    config["searcher"]["name"] = "bayes"
    config["hyperparameters"]["lr"] = {"type": "log", "minval": 0.1, "maxval": 0.01}
    config["resources"]["slots_per_trail"] = 2
    path.write_text(yaml.safe_dump(config))
    db = tmp_path / "out.db"
    result = run_cli(["run", str(path), "--db", f"sqlite:///{db}"], cli_env, tmp_path)
    lines = _assert_usage_error(
        result, "searcher.name", "hyperparameters.lr", "resources.slots_per_trail"
    )
    assert len(lines) == 3, lines
    assert any("tpe" in line for line in lines if line.startswith("searcher.name"))
    assert any("slots_per_trial" in line for line in lines if "slots_per_trail" in line)
    assert not db.exists()


def test_objectives_with_the_median_pruner_are_refused_and_nothing_written(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(
        tmp_path / "exp",
        searcher={"objectives": ["slot_seconds"], "pruner": {"name": "median"}},
    )
    db = tmp_path / "out.db"
    result = run_cli(["run", str(path), "--db", f"sqlite:///{db}"], cli_env, tmp_path)
    lines = _assert_usage_error(result, "searcher: pruner.name: median")
    assert len(lines) == 1, lines
    assert "use asha or hyperband" in lines[0]
    assert not db.exists()


def test_unschedulable_request_is_rejected_at_submission(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(tmp_path / "exp", resources={"slots_per_trial": 3})
    db = tmp_path / "out.db"
    result = run_cli(
        ["run", str(path), "--db", f"sqlite:///{db}", "--slots", "2"], cli_env, tmp_path
    )
    lines = _assert_usage_error(result, "slots_per_trial")
    assert len(lines) == 1
    assert "default" in lines[0]
    assert not db.exists()


def test_bad_database_url_names_the_argument(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write_experiment(tmp_path / "exp")
    result = run_cli(["run", str(path), "--db", "nonsense"], cli_env, tmp_path)
    _assert_usage_error(result, "--db")
    result = run_cli(
        ["run", str(path), "--db", "sqlite:////no/such/folder/x.db"], cli_env, tmp_path
    )
    _assert_usage_error(result, "--db")


def test_unknown_experiment_and_bad_arguments(
    tmp_path: Path, cli_env: dict[str, str], db_url: str
) -> None:
    _assert_usage_error(run_cli(["describe", "nope", "--db", db_url], cli_env, tmp_path), "nope")
    _assert_usage_error(run_cli(["run", "x.yaml", "--slots", "0"], cli_env, tmp_path), "--slots")
    _assert_usage_error(run_cli(["frobnicate"], cli_env, tmp_path), "frobnicate")
    _assert_usage_error(
        run_cli(["run", str(tmp_path / "missing.yaml")], cli_env, tmp_path), "config"
    )


def test_password_is_never_printed(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write_experiment(tmp_path / "exp")
    url = "postgresql://slotsweep:hunter2secret@127.0.0.1:1/sweeps"
    result = run_cli(["run", str(path), "--db", url], cli_env, tmp_path)
    assert result.returncode == 2
    assert "hunter2secret" not in result.stderr + result.stdout
    assert "--db" in result.stderr


def test_hostile_values_exit_2_before_anything_is_written(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(tmp_path / "exp")
    text = path.read_text()
    db = tmp_path / "out.db"
    bomb = "".join(f"  l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]\n" for n in range(1, 9))
    for hostile in (
        text + "hang_timeout_s: .inf\nmax_restarts: 1.0e+100\n",
        text + "data:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + bomb,
        text + "name: again\n",
    ):
        path.write_text(hostile)
        result = run_cli(["run", str(path), "--db", f"sqlite:///{db}"], cli_env, tmp_path)
        lines = _assert_usage_error(result)
        assert len(lines) <= 2, lines
        assert not db.exists()


def test_hostile_cluster_files_and_arguments(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write_experiment(tmp_path / "exp")
    db = tmp_path / "out.db"
    cluster = tmp_path / "cluster.yaml"
    for content in (
        b"resource_pools: [{name: default, agents: [{name: a, slots: 1000000000000000000000000000000}]}]\n",
        "resource_pools: [{name: défaut}]\n".encode("latin-1"),
        b"resource_pools: 2024-01-31\n",
    ):
        cluster.write_bytes(content)
        result = run_cli(
            ["run", str(path), "--db", f"sqlite:///{db}", "--cluster", str(cluster)],
            cli_env,
            tmp_path,
        )
        assert len(_assert_usage_error(result, "cluster")) == 1
    for argv, needle in (
        (["run", str(path), "--slots", "100000000"], "--slots"),
        (["ui", "--port", "70000"], "--port"),
        (["list", "--db", "sqlite://"], "in-memory"),
    ):
        _assert_usage_error(run_cli(argv, cli_env, tmp_path), needle)
    assert not db.exists()


def test_commands_on_a_new_database_create_nothing(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    db = tmp_path / "new.db"
    for argv in (["resume", "e"], ["list"], ["task", "list"]):
        result = run_cli([*argv, "--db", f"sqlite:///{db}"], cli_env, tmp_path)
        assert len(_assert_usage_error(result, "is not a slotsweep database")) == 1
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("hello\n")
    result = run_cli(["describe", "e", "--db", f"sqlite:///{not_sqlite}"], cli_env, tmp_path)
    assert _assert_usage_error(result) == [f"--db: {not_sqlite} is not a SQLite database"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_ten_megabytes_of_unknown_keys_print_fifty_lines(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    path = write_experiment(tmp_path / "exp")
    filler = "x" * 70
    with path.open("a") as stream:
        stream.writelines(f"unknown_{n:06d}_{filler}: {n}\n" for n in range(110_000))
    assert path.stat().st_size > 10_000_000
    db = tmp_path / "out.db"
    result = run_cli(["run", str(path), "--db", f"sqlite:///{db}"], cli_env, tmp_path, timeout=120)
    lines = _assert_usage_error(result)
    assert len(lines) == 51
    assert lines[-1] == "and 109950 more problems"
    assert not db.exists()
