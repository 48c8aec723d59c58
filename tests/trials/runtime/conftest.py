"""Fixtures of the runtime's tests: real trial rows, a real Optuna study, real torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trials import RuntimeSpec

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
REPO_ROOT = HERE.parents[2]


@dataclass
class TrialHandle:
    """A trial row, its Optuna trial, and the RuntimeSpec file that runs it."""

    spec: RuntimeSpec
    spec_path: Path
    db_url: str

    def with_changes(self, **changes: Any) -> TrialHandle:
        """The same trial with spec fields changed (a restart, another attempt).

        A new attempt gets its run row as the driver's restart would: the earlier runs
        ended, the new one restoring from the checkpoint at ``restore_checkpoint_path``.
        """
        spec = self.spec.model_copy(update=changes)
        path = self.spec_path.with_name(f"spec-{spec.trial_id}-{spec.attempt}-{id(changes)}.json")
        path.write_text(spec.model_dump_json())
        if spec.attempt != self.spec.attempt:
            add_run(self.db_url, spec.trial_id, spec.attempt, spec.restore_checkpoint_path)
        return TrialHandle(spec, path, self.db_url)


def add_run(
    db_url: str, trial_id: int, attempt: int, restore_checkpoint_path: str | None = None
) -> None:
    """The driver's launch record of ``attempt``: a TrialRun row, earlier runs ended."""
    from sqlalchemy import select, update

    from storage import Checkpoint, TrialRun, session_scope, utcnow

    with session_scope(db_url) as session:
        # The moment is taken once this transaction holds SQLite's write lock: a rank 0
        # transaction that committed while this one waited came before the supersede.
        session.execute(select(TrialRun.id).limit(1))
        session.execute(
            update(TrialRun)
            .where(TrialRun.trial_id == trial_id, TrialRun.ended_at.is_(None))
            .values(ended_at=utcnow())
        )
        restored = None
        if restore_checkpoint_path is not None:
            restored = session.scalar(
                select(Checkpoint).where(Checkpoint.path == str(restore_checkpoint_path))
            )
        session.add(
            TrialRun(
                trial_id=trial_id,
                attempt=attempt,
                restored_from_checkpoint=restored.uuid if restored else None,
                restored_from_step=restored.step if restored else None,
            )
        )


def create_trial(
    db_url: str,
    tmp_path: Path,
    *,
    study_name: str = "runtime-test",
    pruner: dict[str, Any] | None = None,
    directions: list[str] | None = None,
    **spec_fields: Any,
) -> TrialHandle:
    """An experiment (if new), a trial row and an asked Optuna trial; a spec for it.

    ``directions``: the study's (a new study's; one minimized objective if None).
    """
    import optuna

    from storage import (
        Experiment,
        ExperimentState,
        Trial,
        TrialState,
        optuna_storage,
        optuna_trial_id,
        session_scope,
    )

    storage = optuna_storage(db_url)
    study = optuna.create_study(
        study_name=study_name, storage=storage, load_if_exists=True, directions=directions
    )
    optuna_trial = study.ask()
    optuna_id = optuna_trial_id(db_url, study_name, optuna_trial.number)
    with session_scope(db_url) as session:
        experiment = session.query(Experiment).filter_by(study_name=study_name).one_or_none()
        if experiment is None:
            experiment = Experiment(
                name=study_name,
                study_name=study_name,
                state=ExperimentState.ACTIVE,
                config={},
                model_dir=str(FIXTURES),
                max_trials=10,
            )
            session.add(experiment)
            session.flush()
        hparams = spec_fields.pop("hparams", {"global_batch_size": 8})
        trial = Trial(
            experiment_id=experiment.id,
            optuna_trial_id=optuna_id,
            optuna_trial_number=optuna_trial.number,
            state=TrialState.RUNNING,
            hparams=hparams,
            slots_per_trial=spec_fields.get("slots_per_trial", 2),
        )
        session.add(trial)
        session.flush()
        experiment_id, trial_id = experiment.id, trial.id
        checkpoint_folder = experiment.checkpoint_folder
    add_run(db_url, trial_id, int(spec_fields.get("attempt", 0)))
    fields: dict[str, Any] = {
        "db_url": db_url,
        "experiment_id": experiment_id,
        "checkpoint_folder": checkpoint_folder,
        "trial_id": trial_id,
        "study_name": study_name,
        "optuna_trial_id": optuna_id,
        "optuna_trial_number": optuna_trial.number,
        "entrypoint": "runtime_trials:TinyTrial",
        "model_dir": str(FIXTURES),
        "hparams": hparams,
        "slots_per_trial": 2,
        "max_length": {"batches": 8},
        "searcher_metric": "val_loss",
        "min_validation_period": {"batches": 4},
        "scratch_dir": str(tmp_path / f"scratch-{trial_id}"),
        "checkpoint_storage": {"path": str(tmp_path / "checkpoints")},
        "seed": 1,
    }
    if pruner is not None:
        fields["pruner"] = pruner
    fields.update(spec_fields)
    spec = RuntimeSpec.model_validate(fields)
    path = tmp_path / f"spec-{trial_id}.json"
    path.write_text(spec.model_dump_json())
    return TrialHandle(spec, path, db_url)


def run_torchrun(
    target: list[str],
    *,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    torchrun: str = "torch.distributed.run",
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N <target>``.

    ``torchrun="trials.node.torchrun"`` runs it under the driver's wrapper instead.
    """
    full_env = dict(os.environ)
    full_env.pop("SLOTSWEEP_DB", None)
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    full_env.update(env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            torchrun,
            "--standalone",
            f"--nproc-per-node={nproc}",
            "--max-restarts=0",
            *target,
        ],
        env=full_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_worker(handle: TrialHandle, *, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """Run the trial as the driver does: ``torchrun ... -m trials.node.worker`` under the
    ``torchrun`` wrapper, which forks the ranks (:mod:`trials.node.torchrun`).

    Whatever the trial's end, the run leaves nothing of its own in its temporary folder
    (torchrun by itself would leave one folder there per run).
    """
    with tempfile.TemporaryDirectory(prefix="slotsweep-test-") as temporary:
        result = run_torchrun(
            ["-m", "trials.node.worker"],
            nproc=nproc,
            env={"SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text(), "TMPDIR": temporary},
            torchrun="trials.node.torchrun",
        )
        # torch's compile cache is one folder per user, kept on purpose and reused.
        left = sorted(n for n in os.listdir(temporary) if not n.startswith("torchinductor_"))
    assert not left, f"the trial left {left} in its temporary folder"
    return result


@pytest.fixture
def make_trial(db_url: str, tmp_path: Path) -> Callable[..., TrialHandle]:
    """``make_trial(**spec_fields)``: a fresh trial row, Optuna trial and spec file."""

    def make(**fields: Any) -> TrialHandle:
        return create_trial(db_url, tmp_path, **fields)

    return make
