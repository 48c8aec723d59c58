"""Fixtures for driver and CLI tests: a small copy of the digits example."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import EXAMPLES_DIR


def write_experiment(folder: Path, **overrides: Any) -> Path:
    """Copy the digits example into ``folder`` with a small, fast search; return the YAML path.

    ``slow_model.py`` (entrypoint ``slow_model:SlowDigitsTrial``) is copied beside it for
    tests that interrupt trials on purpose.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES_DIR / "digits" / "model.py", folder / "model.py")
    shutil.copy(Path(__file__).parent / "_slow_model.py", folder / "slow_model.py")
    config = yaml.safe_load((EXAMPLES_DIR / "digits" / "experiment.yaml").read_text())
    config["searcher"].update(max_trials=2, max_length={"epochs": 2}, max_concurrent_trials=1)
    config["hyperparameters"]["optimizer"] = {"type": "categorical", "vals": ["sgd", "adamw"]}
    config["min_checkpoint_period"] = {"epochs": 1}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    path = folder / "experiment.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "searcher.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def experiment_yaml(tmp_path: Path) -> Path:
    return write_experiment(tmp_path / "exp")
