"""``slotsweep run --test``: one short real trial, its phases printed, nothing kept."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from searcher.diagnose.smoke import first_point, run_trial_test
from trials.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = REPO_ROOT / "examples"
DIGITS = EXAMPLES / "digits"

_BROKEN_MODEL = """\
from trials.runtime import PyTorchTrial


class BrokenTrial(PyTorchTrial):
    def __init__(self, context):
        super().__init__(context)
        raise ValueError("no layer named 'conv9' in this model")

    def build_training_data_loader(self):
        raise NotImplementedError

    build_validation_data_loader = build_training_data_loader
    train_batch = evaluate_batch = build_training_data_loader
"""


@pytest.fixture
def user_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory and a default database the test must leave alone."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SLOTSWEEP_DB", f"sqlite:///{tmp_path / 'user.db'}")
    monkeypatch.delenv("SLOTSWEEP_LOG_DIR", raising=False)
    return tmp_path


def _left_behind(root: Path) -> list[Path]:
    # Python's own bytecode cache of the user's module is what any import of it writes
    # (unless PYTHONDONTWRITEBYTECODE is set), not something the test run left.
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_first_point_is_the_first_value_or_the_lower_bound() -> None:
    from trials.config import load_config

    point = first_point(load_config(DIGITS / "experiment.yaml"))
    assert point == {
        "global_batch_size": "32",
        "lr": "0.0001",
        "warmup_epochs": "0",
        "lr_decay": "constant",
        "optimizer": "sgd",
        "weight_decay": "1e-06",
    }


@pytest.mark.slow
@pytest.mark.parametrize("example", ["digits", "charlm"])
def test_an_example_passes_and_leaves_nothing(user_places: Path, example: str) -> None:
    model_dir = user_places / example
    shutil.copytree(EXAMPLES / example, model_dir)
    before = _left_behind(user_places)
    out = io.StringIO()
    code = run_trial_test(model_dir / "experiment.yaml", cluster=None, slots=2, out=out)
    text = out.getvalue()
    assert code == 0, text
    phases = [line.split()[2:4] for line in text.splitlines() if line.split()[2:3]]
    for phase in ("entrypoint", "training", "validation", "checkpoint", "restore"):
        assert [phase, "ok"] in phases, text
    assert "resumed after batch 4, trained to batch 6" in text
    # No database, no checkpoint folder, no logs: only the files that were there.
    assert _left_behind(user_places) == before


@pytest.mark.slow
def test_a_constructor_that_raises_is_named_and_a_typo_is_a_config_error(
    user_places: Path,
) -> None:
    model_dir = user_places / "broken"
    model_dir.mkdir()
    (model_dir / "model.py").write_text(_BROKEN_MODEL)
    config = (DIGITS / "experiment.yaml").read_text()
    config = config.replace("model:DigitsTrial", "model:BrokenTrial")
    config = config.replace("slots_per_trial: 2", "slots_per_trial: 1")
    (model_dir / "experiment.yaml").write_text(config)
    before = _left_behind(user_places)
    out = io.StringIO()
    code = run_trial_test(model_dir / "experiment.yaml", cluster=None, slots=1, out=out)
    text = out.getvalue()
    assert code == 1, text
    assert (
        "trial      FAILED rank 0: ValueError: no layer named 'conv9' in this model "
        "(after 0 batches)" in text
    )
    # The log's tail follows: torchrun's error summary, prefixed as in the log.
    assert any(
        line.startswith("  [torchrun] ") and "ValueError: no layer named 'conv9'" in line
        for line in text.splitlines()
    ), text
    assert _left_behind(user_places) == before

    (model_dir / "experiment.yaml").write_text(config.replace("BrokenTrial", "BrokenTrail"))
    with pytest.raises(ConfigError) as raised:
        run_trial_test(model_dir / "experiment.yaml", cluster=None, slots=1, out=out)
    assert raised.value.problems == [
        "entrypoint: module 'model' has no 'BrokenTrail' (did you mean 'BrokenTrial'?)"
    ]
    assert _left_behind(user_places) == before
