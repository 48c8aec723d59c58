"""The entrypoint is resolved before any slot is spent, in a process of its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from searcher.submit._entrypoint_probe import resolve
from searcher.submit.preflight import check_entrypoint
from trials.config import ExperimentConfig, load_config, parse_config

REPO_ROOT = Path(__file__).resolve().parents[3]
DIGITS = REPO_ROOT / "examples" / "digits"

_MODEL = """\
from trials.runtime import PyTorchTrial

LIMIT = 3


class DigitsTrial(PyTorchTrial):
    pass


def core_main(context):
    pass
"""


def _config(entrypoint: str) -> ExperimentConfig:
    return parse_config(
        {
            "name": "preflight",
            "entrypoint": entrypoint,
            "hyperparameters": {"global_batch_size": 8},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": 1,
                "max_length": {"batches": 1},
            },
        }
    )


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(_MODEL)
    (tmp_path / "broken.py").write_text("import os\n\nVALUE = 1 / 0\n")
    return tmp_path


@pytest.mark.parametrize(
    ("entrypoint", "problem"),
    [
        ("model:DigitsTrial", None),
        ("model:core_main", None),
        (
            "model:DigitTrial",
            "entrypoint: module 'model' has no 'DigitTrial' (did you mean 'DigitsTrial'?)",
        ),
        ("model:Zebra", "entrypoint: module 'model' has no 'Zebra'"),
        (
            "model:LIMIT",
            "entrypoint: model:LIMIT must be a PyTorchTrial subclass or a callable taking the "
            "trial context",
        ),
        (
            "broken:Trial",
            "entrypoint: importing 'broken' failed: ZeroDivisionError: division by zero "
            "(broken.py line 3)",
        ),
    ],
)
def test_the_probe_names_the_problem(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, entrypoint: str, problem: str | None
) -> None:
    # In-process for speed (the probe's own logic); the driver runs it in a subprocess.
    monkeypatch.chdir(model_dir)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    for name in ("model", "broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        assert resolve(str(model_dir), entrypoint) == problem
    finally:
        for name in ("model", "broken"):  # not a module other tests may import
            if name not in before:
                sys.modules.pop(name, None)


@pytest.mark.slow
def test_check_entrypoint_runs_user_code_outside_the_driver(model_dir: Path) -> None:
    (model_dir / "exits.py").write_text("import os\nos._exit(7)\n")
    assert check_entrypoint(load_config(DIGITS / "experiment.yaml"), DIGITS) == []
    assert check_entrypoint(_config("modle:DigitsTrial"), model_dir) == [
        f"entrypoint: no module 'modle' in the model directory {model_dir.resolve()}"
    ]
    assert check_entrypoint(_config("exits:Trial"), model_dir) == [
        "entrypoint: importing 'exits' ended the process (exit code 7)"
    ]
    assert "exits" not in sys.modules  # nothing of the user's came in here


@pytest.mark.slow
def test_check_entrypoint_is_bounded(model_dir: Path) -> None:
    (model_dir / "slow.py").write_text("import time\ntime.sleep(60)\n")
    assert check_entrypoint(_config("slow:Trial"), model_dir, timeout_s=3) == [
        "entrypoint: importing 'slow' took longer than 3 s"
    ]


@pytest.mark.slow
def test_a_trial_that_does_not_use_torch_is_checked_without_importing_it(
    model_dir: Path,
) -> None:
    """The check imports what the user's module imports: a plain function trial (not
    PyTorch) does not pay for torch's import (seconds of CPU) before its search starts."""
    seen = model_dir / "torch_seen.txt"
    (model_dir / "plain.py").write_text(
        "import pathlib, sys\n"
        f"pathlib.Path({str(seen)!r}).write_text(str('torch' in sys.modules))\n"
        "def objective(context):\n    pass\n"
    )
    assert check_entrypoint(_config("plain:objective"), model_dir) == []
    assert seen.read_text() == "False"
