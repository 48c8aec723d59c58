"""Whole searches whose checkpoints are damaged: the trial goes on from an intact one.

A one-trial search through the CLI, one checkpoint an epoch, three kept
(``save_trial_latest: 3``), ``max_restarts: 2``:

- a power loss (the driver and the trial's processes SIGKILLed) after three
  checkpoints, the newest checkpoint's ``state.pt`` then cut to 64 bytes (or every
  checkpoint's), and ``slotsweep resume``: the first attempt of the resume skips it;
- a trial that damages its newest checkpoint and crashes: the driver's restart inside
  the running search skips it (cold, and on warm workers).

On a folder and on an S3 bucket (moto's server). Each ends with the search COMPLETED and
consistent, no restart spent on the skipped checkpoints, the damaged ones kept and
marked CORRUPTED, and ``describe``, the trial's log and the run's reason naming them and
why. The fallback's own cases are in ``tests/trials/runtime/test_restore.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from storage import Checkpoint, CheckpointState, Trial, TrialRun, session_scope
from tests.conftest import cli_environment
from tests.searcher.conftest import (
    assert_search_consistent,
    completed_checkpoints,
    executor_resources,
    power_loss,
    run_cli,
    run_to_end,
    start_cli,
    wait_for,
    write_experiment,
)
from trials import store_for

pytestmark = pytest.mark.slow


def _experiment(folder: Path, storage_path: str, **overrides: Any) -> Path:
    """One slow trial of 8 epochs, one checkpoint an epoch (3 batches), three kept."""
    settings: dict[str, Any] = {
        "entrypoint": "slow_model:SlowDigitsTrial",
        "hyperparameters": {"global_batch_size": 512},
        "data": {"batch_delay_s": 0.3},
        "searcher": {"max_trials": 1, "max_length": {"epochs": 8}, "pruner": {"name": "none"}},
        "resources": {"slots_per_trial": 1},
        "checkpoint_storage": {"path": storage_path, "save_trial_latest": 3, "save_trial_best": 0},
        "max_restarts": 2,
    }
    for key, value in overrides.items():
        settings[key] = {**settings[key], **value} if isinstance(value, dict) else value
    path = write_experiment(folder, **settings)
    config = yaml.safe_load(path.read_text())
    config["min_validation_period"] = config["min_checkpoint_period"] = {"epochs": 1}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _storage(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> tuple[str, dict[str, str]]:
    """The checkpoint path for ``kind`` (a folder, or a fresh S3 bucket) and the CLI's
    environment (with the bucket's credentials)."""
    if kind == "bucket":
        bucket = request.getfixturevalue("s3_bucket")  # sets the credentials first
        return f"{bucket}/sweeps", cli_environment()
    return str(tmp_path / "checkpoints"), cli_environment()


def _checkpoints(db: str) -> list[Checkpoint]:
    with session_scope(db) as session:
        rows = list(session.scalars(select(Checkpoint).order_by(Checkpoint.step, Checkpoint.id)))
        session.expunge_all()
    return rows


def _cut(location: str) -> None:
    """``state.pt`` of the checkpoint at ``location`` cut to its first 64 bytes."""
    store = store_for(location)
    with store.read(location, "state.pt") as f:
        head = f.read(64)
    if location.startswith("s3://"):
        store.fs.pipe_file(f"{location[len('s3://') :]}/state.pt", head)  # type: ignore[attr-defined]
    else:
        Path(location, "state.pt").write_bytes(head)


def _assert_skipped_and_said(
    db: str, tmp_path: Path, damaged: list[Checkpoint], restored_step: int | None, describe: str
) -> TrialRun:
    """The damaged checkpoints are kept and marked; the run that met them, its reason,
    the trial's log and ``describe`` say which and why. Returns that run."""
    rows = {row.uuid: row for row in _checkpoints(db)}
    for checkpoint in damaged:
        row = rows[checkpoint.uuid]
        assert row.state == CheckpointState.CORRUPTED, (row.step, row.state)
        assert row.problem is not None
        assert row.problem.startswith("state.pt: 64 bytes, its manifest says "), row.problem
        with store_for(row.path).read(row.path, "state.pt") as f:
            assert len(f.read()) == 64  # kept as it was found, for inspection
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.attempt)))
        session.expunge_all()
    met = runs[1]
    assert met.restored_from_step == restored_step
    names = [f"the checkpoint of step {c.step} ({c.uuid[:8]})" for c in damaged[::-1]]
    assert met.reason is not None
    expected_start = (
        "started over from step 0: every checkpoint was damaged; skipped "
        if restored_step is None
        else f"continued from the checkpoint of step {restored_step}; skipped "
    )
    assert met.reason.startswith(expected_start), met.reason
    assert all(name in met.reason for name in names), met.reason
    log = Path(str(trial.log_path)).read_text()
    for name in names:
        assert (
            f"[rank 0] slotsweep: {name} is damaged and was skipped (kept, marked CORRUPTED)"
            in (log)
        )
    assert f"[rank 0] slotsweep: {met.reason}" in log
    # describe names each one, under the table, and in its JSON.
    flat = " ".join(describe.split())
    for name in names:
        assert f"#0: {name} was skipped as damaged: state.pt: 64 bytes" in flat, describe
    return met


@pytest.mark.parametrize(
    ("storage", "damage"), [("folder", "newest"), ("bucket", "all")], ids=["folder", "bucket-all"]
)
def test_a_resume_after_a_power_loss_skips_damaged_checkpoints(
    request: pytest.FixtureRequest, tmp_path: Path, storage: str, damage: str
) -> None:
    storage_path, env = _storage(request, storage, tmp_path)
    path = _experiment(tmp_path / "exp", storage_path)
    db = f"sqlite:///{tmp_path / 'search.db'}"
    common = ["--db", db, "--slots", "1"]
    driver = start_cli(["run", str(path), *common], env, tmp_path)
    wait_for(lambda: completed_checkpoints(db) >= 3, what="three checkpoints")
    power_loss(driver, db)
    recorded = [c for c in _checkpoints(db) if c.state == CheckpointState.COMPLETED]
    assert len(recorded) >= 3
    damaged = recorded if damage == "all" else recorded[-1:]
    for checkpoint in damaged:
        _cut(checkpoint.path)

    run_to_end(["resume", "1", *common], env, tmp_path)

    describe = run_cli(["describe", "1", "--db", db], env, tmp_path)
    assert describe.returncode == 0, describe.stderr
    restored = None if damage == "all" else recorded[-2].step
    _assert_skipped_and_said(db, tmp_path, damaged, restored, describe.stdout)
    described = json.loads(run_cli(["describe", "1", "--db", db, "--json"], env, tmp_path).stdout)
    skipped = described["trials"][0]["skipped_checkpoints"]
    assert {s["uuid"] for s in skipped} == {c.uuid for c in damaged}
    # No restart was spent on them: the resume's first attempt went on past them.
    assert described["trials"][0]["restarts"] == 0
    assert described["trials"][0]["state"] == "COMPLETED"
    assert_search_consistent(db)


@pytest.mark.parametrize(
    ("executor", "storage"),
    [("local", "folder"), ("local-warm", "bucket")],
    ids=["cold-folder", "warm-bucket"],
)
def test_a_restart_within_a_search_skips_a_checkpoint_damaged_as_its_trial_crashed(
    request: pytest.FixtureRequest, tmp_path: Path, executor: str, storage: str
) -> None:
    storage_path, env = _storage(request, storage, tmp_path)
    path = _experiment(
        tmp_path / "exp",
        storage_path,
        entrypoint="slow_model:DamagingDigitsTrial",
        data={"damage_at_epoch": 3, "damage_newest": 1},
        resources={"slots_per_trial": 1, **executor_resources(executor)},
    )
    db = f"sqlite:///{tmp_path / 'search.db'}"
    output = run_to_end(["run", str(path), "--db", db, "--slots", "1"], env, tmp_path)

    rows = _checkpoints(db)
    damaged = [row for row in rows if row.state == CheckpointState.CORRUPTED]
    assert [row.step for row in damaged] == [9], [(r.step, r.state) for r in rows]
    describe = run_cli(["describe", "1", "--db", db], env, tmp_path)
    met = _assert_skipped_and_said(db, tmp_path, damaged, 6, describe.stdout)
    assert "restart 1 of 2" in output  # the crash, not the damage, took the restart
    with session_scope(db) as session:
        trial = session.scalars(select(Trial)).one()
        assert (trial.state.value, trial.restarts) == ("COMPLETED", 1)
    if executor == "local-warm":
        assert met.spec is not None and met.spec["warm"] is not None
    assert_search_consistent(db)
