"""Checkpoints in an S3 bucket (a real S3-compatible server: moto's, ``.ci/s3.sh``).

The store on its own: a checkpoint round trip, an upload SIGKILLed half-way (never
offered, the previous one still loads, garbage collection removes it, and a whole one
whose row was never written, but nothing of another database's experiment of the same
id in the same bucket), a bucket that does not exist or refuses uploads (one line naming
the URL and the provider's reason, the checkpoints written before kept). Then a two-rank
trial checkpointing to the bucket: a rank SIGKILLed, the next attempt restored from the
bucket mid-epoch, retention deleting exactly the checkpoints its policy names, the UI's
download, and the credentials in none of the logs, the spec, the command line or the
database; beside its first attempt, a one-rank trial whose bucket is missing fails with
one line, and beside its second, one whose bucket refuses its background uploads (as for
a full disk).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from sqlalchemy import select, text

from storage import (
    Checkpoint,
    CheckpointState,
    Metric,
    MetricKind,
    Trial,
    TrialFailure,
    TrialRun,
    session_scope,
    upgrade_schema,
)
from tests.conftest import S3_SECRET, add_experiment, checkpoint_folder
from trials import CheckpointStorageConfig, collect_garbage, store_for, trial_checkpoint_dir
from trials.checkpoint_storage import (
    MANIFEST_FILE,
    CheckpointCorruptedError,
    CheckpointStorageError,
)
from trials.runtime._checkpoint import METADATA_FILE, STATE_FILE, read_checkpoint, write_checkpoint
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial
from ui._checkpoints import checkpoint_bytes, checkpoint_problem, download_name

from .conftest import TrialHandle, add_run, create_trial, run_worker

pytestmark = pytest.mark.slow

_HALF_WRITE = textwrap.dedent(
    """
    import os, signal, sys, torch
    from trials import store_for

    def state(f):
        torch.save({"w": torch.ones(100_000)}, f)

    def metadata(f):
        f.write(b'{"step": ')
        os.kill(os.getpid(), signal.SIGKILL)

    store_for(sys.argv[1]).write(sys.argv[1], "half", {"state.pt": state, "metadata.json": metadata})
    """
)


def test_a_half_written_upload_is_never_offered_and_is_collected(
    s3_bucket: str, tmp_path: Path
) -> None:
    db_url, other_url = (f"sqlite:///{tmp_path / name}.sqlite" for name in ("db", "other"))
    policy = CheckpointStorageConfig(path=f"{s3_bucket}/ckpt")
    folders = []
    for url in (db_url, other_url):
        upgrade_schema(url)
        experiment_id, (trial_id, bare_trial_id) = add_experiment(url, [{}, {}])
        experiment_folder = checkpoint_folder(url, experiment_id)
        folders.append(
            [
                str(trial_checkpoint_dir(policy.path, ".", experiment_folder, t))
                for t in (trial_id, bare_trial_id)
            ]
        )
    # bare_folder: a trial whose only upload was killed, so no row leads to its folder.
    # other_folder: another database's experiment and trial of the same ids, in the same
    # bucket: a folder of its own.
    [folder, bare_folder], [other_folder, _] = folders
    assert folder.startswith(f"{policy.path}/{experiment_id}-") and folder.endswith(f"/{trial_id}")
    assert other_folder != folder and other_folder.startswith(f"{policy.path}/{experiment_id}-")
    before, size = write_checkpoint(folder, "before", {"w": torch.arange(5.0)}, {"step": 1})
    assert before == f"{folder}/before" and size > 0
    killed = [
        subprocess.Popen(
            [sys.executable, "-c", _HALF_WRITE, where], stderr=subprocess.PIPE, text=True
        )
        for where in (folder, bare_folder)
    ]
    for process in killed:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == -signal.SIGKILL, stderr
    store = store_for(folder)
    half, bare_half = f"{folder}/half", f"{bare_folder}/half"
    for location in (half, bare_half):
        assert store.fs.exists(f"{location[len('s3://') :]}/state.pt")  # uploaded, no manifest
        assert not store.is_complete(location)
        with pytest.raises(FileNotFoundError, match="no checkpoint at"):
            read_checkpoint(location)
        assert checkpoint_problem(location, "COMPLETED") == (
            f"The checkpoint is missing from storage: {location}"
        )
    assert store.incomplete(folder) == [half]
    assert store.incomplete(bare_folder) == [bare_half]
    torch.testing.assert_close(read_checkpoint(before)["w"], torch.arange(5.0))
    # Rank 0 died between a manifest and its row: whole, and no row records it.
    unrecorded, _ = write_checkpoint(folder, "unrecorded", {"w": torch.zeros(2)}, {"step": 2})
    # The other database's rank 0 is writing: one upload whose row is not committed yet,
    # one whose manifest is not written yet.
    add_run(other_url, trial_id, 0)
    write_checkpoint(other_folder, "between", {"w": torch.zeros(2)}, {"step": 2})
    store.fs.pipe_file(f"{other_folder[len('s3://') :]}/writing/state.pt", b"x")

    # Retention's garbage collection removes the half-written prefix and the unrecorded
    # whole one (no run of the trial runs), not the recorded one: rank 0's in its own
    # trial's folder only, the driver's final sweep in every trial's, the one with no
    # recorded checkpoint included; nothing in the other database's folder.
    with session_scope(db_url) as session:
        session.add(
            Checkpoint(
                uuid="before",
                trial_id=trial_id,
                step=1,
                path=str(before),
                state=CheckpointState.COMPLETED,
            )
        )
    for only_trial in (trial_id, None):
        with session_scope(db_url) as session:
            deleted = collect_garbage(
                session,
                experiment_id=experiment_id,
                policy=policy,
                metric="val_loss",
                smaller_is_better=True,
                trial_id=only_trial,
            )
        assert deleted == []
        assert store.incomplete(folder) == []
        assert store.incomplete(bare_folder) == ([bare_half] if only_trial else [])
        assert store.whole(folder) == [str(before)]  # no run of the trial is running
    assert not store.fs.exists(bare_folder[len("s3://") :])
    assert store.is_complete(str(before)) and not store.fs.exists(str(unrecorded)[len("s3://") :])
    assert store.whole(other_folder) == [f"{other_folder}/between"]
    assert store.incomplete(other_folder) == [f"{other_folder}/writing"]


def test_a_missing_bucket_is_one_line_naming_the_url(s3_bucket: str) -> None:
    folder = f"{s3_bucket}-missing/ckpt/1/1"
    with pytest.raises(CheckpointStorageError) as error:
        write_checkpoint(folder, "c", {"w": torch.arange(5.0)}, {})
    assert str(error.value) == (
        f"checkpoint_storage.path {folder}: The specified bucket does not exist"
    )


@pytest.mark.parametrize("elements", [5, 16_000_000], ids=["one-object", "multipart"])
def test_a_bucket_refusing_writes_is_one_line_and_keeps_the_previous(
    s3_bucket: str, elements: int
) -> None:
    folder = f"{s3_bucket}/ckpt/1/1"
    before, _ = write_checkpoint(folder, "before", {"w": torch.arange(5.0)}, {"step": 1})
    _refuse_writes(s3_bucket)
    # 64 MB goes up in parts (s3fs's blocks are smaller): each part is refused too.
    with pytest.raises(CheckpointStorageError) as error:
        write_checkpoint(folder, "after", {"w": torch.zeros(elements)}, {"step": 2})
    # moto answers 403 with no body: botocore's reason is the HTTP status's.
    assert str(error.value) == f"checkpoint_storage.path {folder}: Forbidden"
    store = store_for(folder)
    assert store.fs.ls(folder[len("s3://") :], refresh=True) == [str(before)[len("s3://") :]]
    torch.testing.assert_close(read_checkpoint(before)["w"], torch.arange(5.0))


def _refuse_writes(bucket_url: str) -> None:
    """A bucket policy denying every upload to ``s3://BUCKET`` (reads and deletes stay)."""
    import boto3

    bucket = bucket_url[len("s3://") :]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:PutObject",
                "Resource": f"arn:aws:s3:::{bucket}/*",
            }
        ],
    }
    boto3.client("s3").put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))


def test_a_trial_checkpoints_to_the_bucket_restores_and_collects(
    s3_bucket: str, db_url: str, tmp_path: Path
) -> None:
    storage_path = f"{s3_bucket}/ckpt"
    missing_path = f"{s3_bucket}-missing/ckpt"
    missing = create_trial(
        db_url,
        tmp_path,
        slots_per_trial=1,
        max_length={"batches": 4},
        min_checkpoint_period={"batches": 4},
        checkpoint_storage={"path": missing_path},
    )
    crashed = create_trial(
        db_url,
        tmp_path,
        hparams={"global_batch_size": 8, "crash_at_step": 6},
        max_length={"batches": 12},
        min_validation_period={"batches": 4},
        min_checkpoint_period={"batches": 4},
        checkpoint_storage={"path": storage_path, "save_trial_latest": 1, "save_trial_best": 0},
    )
    # A trial whose bucket is missing runs beside the first attempt: each is a whole
    # torchrun start, and running them together saves one start's wall time.
    with ThreadPoolExecutor(max_workers=1) as pool:
        missing_run = pool.submit(run_worker, missing, nproc=1)
        first = run_worker(crashed)
        failed = missing_run.result()
    assert first.returncode != 0
    _assert_failed_with_one_line(
        failed, missing, missing_path, "The specified bucket does not exist"
    )
    assert _checkpoints(db_url, missing.spec.trial_id) == []
    rows = _checkpoints(db_url, crashed.spec.trial_id)
    assert [(r.step, r.state) for r in rows] == [(4, CheckpointState.COMPLETED)]
    folder = f"{storage_path}/{crashed.spec.checkpoint_folder}/{crashed.spec.trial_id}"
    assert crashed.spec.checkpoint_folder.startswith(f"{crashed.spec.experiment_id}-")
    assert rows[0].path == f"{folder}/{rows[0].uuid}"

    # The driver's restart: attempt 1 restores step 4 from the bucket (mid-epoch: an
    # epoch is 8 batches) and trains to step 12. Retention keeps the newest and the one
    # the attempt (not ended: the driver would end it) restores from; it deletes step 8.
    # Beside it, a trial whose bucket refuses every upload fails as for a full disk.
    refusing_bucket = f"{s3_bucket}-refusing"
    boto3.client("s3").create_bucket(Bucket=refusing_bucket[len("s3://") :])
    _refuse_writes(refusing_bucket)
    refused = create_trial(
        db_url,
        tmp_path,
        slots_per_trial=1,
        max_length={"batches": 4},
        min_checkpoint_period={"batches": 4},
        # Written in the background: the refusal fails the trial all the same.
        checkpoint_storage={"path": f"{refusing_bucket}/ckpt", "async_upload": True},
    )
    restarted = crashed.with_changes(attempt=1, restore_checkpoint_path=rows[0].path)
    with ThreadPoolExecutor(max_workers=1) as pool:
        refused_run = pool.submit(run_worker, refused, nproc=1)
        second = run_worker(restarted)
        refused_result = refused_run.result()
    assert second.returncode == 0, second.stderr[-4000:]
    _assert_failed_with_one_line(refused_result, refused, f"{refusing_bucket}/ckpt", "Forbidden")
    assert _checkpoints(db_url, refused.spec.trial_id) == []
    rows = _checkpoints(db_url, crashed.spec.trial_id)
    assert [(r.step, r.state) for r in rows] == [
        (4, CheckpointState.COMPLETED),
        (8, CheckpointState.DELETED),
        (12, CheckpointState.COMPLETED),
    ]
    store = store_for(folder)
    assert [store.is_complete(r.path) for r in rows] == [True, False, True]
    assert sorted(store.fs.ls(folder[len("s3://") :], refresh=True)) == sorted(
        r.path[len("s3://") :] for r in (rows[0], rows[2])
    )
    assert read_checkpoint(rows[-1].path)["step"] == 12
    assert rows[-1].size_bytes == sum(
        json.loads(store.fs.cat_file(f"{rows[-1].path[len('s3://') :]}/MANIFEST.json"))[
            "files"
        ].values()
    )

    # The UI's download: a zip of the checkpoint's files.
    assert checkpoint_problem(rows[-1].path, "COMPLETED") is None
    assert download_name(rows[-1].path, "bucket", 0, 12) == "bucket-0-step12.zip"
    archive = zipfile.ZipFile(io.BytesIO(checkpoint_bytes(rows[-1].path)))
    assert sorted(archive.namelist()) == ["metadata.json", "state.pt"]
    loaded = torch.load(io.BytesIO(archive.read("state.pt")), weights_only=True)
    assert loaded["step"] == 12

    # The credentials are in the environment only.
    for where in (first.stdout, first.stderr, second.stdout, second.stderr):
        assert S3_SECRET not in where
    assert S3_SECRET not in restarted.spec_path.read_text()
    assert S3_SECRET not in _database_text(db_url)
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == S3_SECRET  # what the ranks inherited


def _assert_failed_with_one_line(
    result: subprocess.CompletedProcess[str], handle: TrialHandle, storage_path: str, reason: str
) -> None:
    """The trial failed as for a full disk: one line naming its folder and the provider's
    ``reason``, no traceback before it, no secret, the failure recorded, no finish."""
    output = result.stdout + result.stderr
    folder = f"{storage_path}/{handle.spec.checkpoint_folder}/{handle.spec.trial_id}"
    line = f"[rank 0] slotsweep: checkpoint_storage.path {folder}: {reason}"
    assert result.returncode != 0
    assert output.count(line) == 1, output[-3000:]
    assert "Traceback" not in output.split(line)[0]
    assert S3_SECRET not in output
    with session_scope(handle.db_url) as session:
        trial = session.get(Trial, handle.spec.trial_id)
        assert trial is not None and trial.finished_at is None
        failures = list(
            session.scalars(
                select(TrialFailure.message).where(TrialFailure.trial_id == handle.spec.trial_id)
            )
        )
    assert f"checkpoint_storage.path {folder}: {reason}" in failures


def _checkpoints(db_url: str, trial_id: int) -> list[Checkpoint]:
    with session_scope(db_url) as session:
        rows = list(
            session.scalars(
                select(Checkpoint).where(Checkpoint.trial_id == trial_id).order_by(Checkpoint.id)
            )
        )
        session.expunge_all()
    return rows


def _database_text(db_url: str) -> str:
    """Every value of every table, as text."""
    with session_scope(db_url) as session:
        tables = [
            name
            for (name,) in session.execute(
                text("SELECT name FROM sqlite_master WHERE type = 'table'")
            )
        ]
        return "\n".join(
            repr(row)
            for table in tables
            for row in session.execute(text(f'SELECT * FROM "{table}"'))
        )


# ------------------------------------------ a damaged checkpoint in the bucket: found, skipped


def _object(location: str, name: str) -> str:
    return f"{location[len('s3://') :]}/{name}"


def _truncate_object(location: str, name: str, size: int = 64) -> None:
    """What a half-finished overwrite or a torn copy leaves: the object's first bytes."""
    store = store_for(location)
    store.fs.pipe_file(_object(location, name), store.fs.cat_file(_object(location, name))[:size])


def _name_a_file_that_is_not_there(location: str) -> None:
    store = store_for(location)
    manifest = json.loads(store.fs.cat_file(_object(location, MANIFEST_FILE)))
    manifest["files"]["optimizer.pt"] = 10
    manifest["sha256"]["optimizer.pt"] = "0" * 64
    store.fs.pipe_file(_object(location, MANIFEST_FILE), json.dumps(manifest).encode())


def _alter_object(location: str, name: str) -> None:
    store = store_for(location)
    data = bytearray(store.fs.cat_file(_object(location, name)))
    data[len(data) // 2] ^= 0xFF
    store.fs.pipe_file(_object(location, name), bytes(data))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda loc: _truncate_object(loc, STATE_FILE),
            r"^state\.pt: 64 bytes, its manifest says",
        ),
        (
            lambda loc: store_for(loc).fs.rm(_object(loc, STATE_FILE)),
            r"^state\.pt is missing \(its manifest names it\)$",
        ),
        (_name_a_file_that_is_not_there, r"^optimizer\.pt is missing \(its manifest names it\)$"),
        (lambda loc: _alter_object(loc, STATE_FILE), r"^state\.pt: its SHA-256 digest differs"),
    ],
    ids=["truncated-object", "missing-object", "manifest-names-a-missing-file", "altered-object"],
)
def test_a_damaged_checkpoint_in_the_bucket_is_refused_naming_the_object(
    s3_bucket: str, damage: Callable[[str], None], problem: str
) -> None:
    folder = f"{s3_bucket}/ckpt/1/1"
    location, _ = write_checkpoint(folder, "c", {"w": torch.arange(5.0)}, {"step": 1})
    location = str(location)
    manifest = json.loads(store_for(location).fs.cat_file(_object(location, MANIFEST_FILE)))
    assert sorted(manifest["sha256"]) == [METADATA_FILE, STATE_FILE]
    damage(location)
    with pytest.raises(CheckpointCorruptedError) as raised:
        read_checkpoint(location)
    assert re.search(problem, raised.value.problem), raised.value.problem
    assert str(raised.value) == f"checkpoint {location}: {raised.value.problem}"
    with pytest.raises(CheckpointCorruptedError):
        store_for(location).verify(location)


def test_a_restore_from_the_bucket_falls_back_past_a_truncated_object(
    s3_bucket: str, db_url: str, tmp_path: Path
) -> None:
    """One rank in this process: the newest checkpoints' ``state.pt`` objects truncated,
    the restart continues from step 8's, downloaded from the bucket, on the trajectory
    of an uninterrupted run; the damaged objects stay in the bucket."""
    common: dict[str, Any] = {
        "hparams": {"global_batch_size": 4},
        "slots_per_trial": 1,
        "max_length": {"batches": 16},
        "min_validation_period": {"batches": 4},
        "min_checkpoint_period": {"batches": 4},
        "profiling": {"enabled": False},
        "checkpoint_storage": {"path": f"{s3_bucket}/ckpt", "save_trial_latest": 100},
    }
    reference = create_trial(db_url, tmp_path, **common)
    assert run_trial(reference.spec, DistributedInfo()) == "finished"
    first = create_trial(
        db_url, tmp_path, **{**common, "hparams": {"global_batch_size": 4, "preempt_at_step": 9}}
    )
    assert run_trial(first.spec, DistributedInfo()) == "preempted"
    trial_id = first.spec.trial_id
    _four, eight, *newer = _checkpoints(db_url, trial_id)
    assert eight.step == 8 and newer
    for checkpoint in newer:
        _truncate_object(checkpoint.path, STATE_FILE)
    restarted = first.with_changes(attempt=1, restore_checkpoint_path=newer[-1].path)
    assert run_trial(restarted.spec, DistributedInfo()) == "finished"

    rows = {row.uuid: row for row in _checkpoints(db_url, trial_id)}
    for checkpoint in newer:
        row = rows[checkpoint.uuid]
        assert row.state == CheckpointState.CORRUPTED
        assert row.problem is not None and row.problem.startswith("state.pt: 64 bytes, its ")
        assert len(store_for(row.path).fs.cat_file(_object(row.path, STATE_FILE))) == 64
    with session_scope(db_url) as session:
        run = session.scalars(
            select(TrialRun).where(TrialRun.trial_id == trial_id, TrialRun.attempt == 1)
        ).one()
        assert (run.restored_from_checkpoint, run.restored_from_step) == (eight.uuid, 8)
        assert run.reason is not None
        assert run.reason.startswith("continued from the checkpoint of step 8; skipped ")
    for name, kind in (("loss", MetricKind.TRAINING), ("val_loss", MetricKind.VALIDATION)):
        assert _series(db_url, trial_id, name, kind) == _series(
            db_url, reference.spec.trial_id, name, kind
        )


def test_retention_in_the_bucket_keeps_the_newest_intact_checkpoint(
    s3_bucket: str, db_url: str
) -> None:
    """Newer checkpoints that fail their manifest do not count: the newest one that
    passes stays, whatever the policy; the damaged ones are marked, and stay too."""
    experiment_id, (trial_id,) = add_experiment(db_url)
    folder = f"{s3_bucket}/ckpt/{checkpoint_folder(db_url, experiment_id)}/{trial_id}"
    paths = {}
    for step in (10, 20, 30, 40):
        location, _ = write_checkpoint(folder, f"c{step}", {"w": torch.ones(3)}, {})
        paths[step] = str(location)
        with session_scope(db_url) as session:
            session.add(
                Checkpoint(
                    uuid=f"c{step}",
                    trial_id=trial_id,
                    step=step,
                    path=str(location),
                    state=CheckpointState.COMPLETED,
                )
            )
    _truncate_object(paths[40], STATE_FILE)
    store_for(paths[30]).fs.rm(_object(paths[30], STATE_FILE))
    policy = CheckpointStorageConfig(
        path=f"{s3_bucket}/ckpt", save_trial_latest=1, save_trial_best=0
    )
    with session_scope(db_url) as session:
        deleted = collect_garbage(
            session, experiment_id=experiment_id, policy=policy, metric="m", smaller_is_better=True
        )
    assert deleted == ["c10"]
    with session_scope(db_url) as session:
        states = dict(session.execute(select(Checkpoint.uuid, Checkpoint.state)).all())
    assert states == {
        "c10": CheckpointState.DELETED,
        "c20": CheckpointState.COMPLETED,
        "c30": CheckpointState.CORRUPTED,
        "c40": CheckpointState.CORRUPTED,
    }
    assert store_for(folder).whole(folder) == [paths[20], paths[30], paths[40]]
    torch.testing.assert_close(read_checkpoint(paths[20])["w"], torch.ones(3))


def _series(db_url: str, trial_id: int, name: str, kind: MetricKind) -> dict[int, float | None]:
    with session_scope(db_url) as session:
        rows = session.scalars(
            select(Metric).where(
                Metric.trial_id == trial_id, Metric.name == name, Metric.kind == kind
            )
        )
        return {row.step: row.value for row in rows}
