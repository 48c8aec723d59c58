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


def test_unknown_experiment_and_bad_arguments(tmp_path: Path, cli_env: dict[str, str]) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    _assert_usage_error(run_cli(["describe", "nope", "--db", db], cli_env, tmp_path), "nope")
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
