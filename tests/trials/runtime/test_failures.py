"""A rank that fails with an exception records why; every log line says who wrote it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.trials.runtime.conftest import REPO_ROOT, TrialHandle, add_run, run_worker
from trials.runtime._failure import MESSAGE_MAX_CHARS, failure_fields, record_failure

_PREFIX = re.compile(r"^\[(rank \d+|torchrun|slotsweep)\] ")


def _failures(db_url: str, trial_id: int) -> list[dict[str, object]]:
    from sqlalchemy import select

    from storage import TrialFailure, TrialRun, session_scope

    with session_scope(db_url) as session:
        rows = session.execute(
            select(TrialFailure, TrialRun.attempt)
            .join(TrialRun, TrialRun.id == TrialFailure.run_id)
            .where(TrialFailure.trial_id == trial_id)
            .order_by(TrialFailure.rank)
        ).all()
        return [
            {
                "attempt": attempt,
                "rank": f.rank,
                "type": f.exception_type,
                "message": f.message,
                "traceback": f.traceback,
                "steps": f.steps_completed,
            }
            for f, attempt in rows
        ]


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_failure_fields_keep_the_first_line_and_the_last_frames() -> None:
    def recurse(depth: int) -> None:
        if depth == 0:
            raise KeyError("x" * (MESSAGE_MAX_CHARS + 50) + "\nmore")
        recurse(depth - 1)

    try:
        recurse(40)
    except KeyError as error:
        fields = failure_fields(error)
    assert fields["exception_type"] == "KeyError"
    assert "\n" not in fields["message"] and len(fields["message"]) == MESSAGE_MAX_CHARS
    tb = fields["traceback"]
    assert tb.startswith("Traceback") and tb.rstrip().splitlines()[-1].startswith("KeyError")
    # Only the innermost frames: the raise is there, the test's own frame (outermost) not.
    assert 'raise KeyError("x"' in tb and "recurse(40)" not in tb


def test_record_failure_writes_one_row_per_rank_under_the_current_run(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial()
    spec = handle.spec
    error = _raised(ValueError("bad shape (3, 4)"))
    assert record_failure(spec, 1, error, 7)
    assert record_failure(spec, 1, error, 7)  # a re-run after a lost acknowledgement
    assert record_failure(spec, 0, _raised(OSError("disk full")), 0)
    rows = _failures(handle.db_url, spec.trial_id)
    assert [(r["rank"], r["type"], r["message"], r["steps"]) for r in rows] == [
        (0, "OSError", "disk full", 0),
        (1, "ValueError", "bad shape (3, 4)", 7),
    ]
    # A superseded attempt records nothing, and says so by returning False.
    add_run(handle.db_url, spec.trial_id, 1)
    assert not record_failure(spec, 0, error, 0)
    assert len(_failures(handle.db_url, spec.trial_id)) == 2


def test_record_failure_is_bounded_when_the_database_is_unusable(
    make_trial: Callable[..., TrialHandle], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = make_trial()
    spec = handle.spec.model_copy(update={"db_url": f"sqlite:///{tmp_path}/missing/dir/x.db"})
    assert not record_failure(spec, 0, _raised(ValueError("boom")), 0, timeout_s=5.0)
    assert "the failure was not recorded" in capsys.readouterr().err


@pytest.mark.slow
def test_constructor_error_is_recorded_and_every_log_line_is_prefixed(
    make_trial: Callable[..., TrialHandle], tmp_path: Path
) -> None:
    """Run as the launcher does: the torchrun wrapper, output appended to a log file."""
    handle = make_trial(
        entrypoint="failing_trials:FailingTrial",
        hparams={"global_batch_size": 8, "raise_in_init": True},
    )
    log_path = tmp_path / "trial.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "SLOTSWEEP_TRIAL_SPEC": handle.spec_path.read_text(),
    }
    env.pop("SLOTSWEEP_DB", None)
    with open(log_path, "a", buffering=1) as log:
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "trials.node.torchrun",
                "--standalone",
                "--nnodes=1",
                "--nproc-per-node=2",
                "--max-restarts=0",
                "-m",
                "trials.node.worker",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=180,
            check=False,
        ).returncode
    text = log_path.read_text()
    assert code == 1, text
    rows = _failures(handle.db_url, handle.spec.trial_id)
    assert [(r["rank"], r["type"], r["steps"]) for r in rows] == [
        (0, "ValueError", 0),
        (1, "ValueError", 0),
    ], text
    assert rows[1]["message"] == "bad layer size on rank 1"
    assert "failing_trials.py" in str(rows[1]["traceback"])
    lines = [line for line in text.splitlines() if line.strip()]
    unprefixed = [line for line in lines if not _PREFIX.match(line)]
    assert not unprefixed, text
    # torchrun's own error summary is in the log, as torchrun's; rank lines once prefixed.
    assert any(line.startswith("[torchrun] ") and "ChildFailedError" in line for line in lines)
    assert any(line.startswith("[rank 1] ValueError: bad layer size") for line in lines)
    assert not any("[torchrun] [rank" in line for line in lines)


@pytest.mark.slow
def test_error_after_progress_records_the_steps_completed(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(
        entrypoint="failing_trials:FailingTrial",
        hparams={"global_batch_size": 8, "raise_at_step": 3},
    )
    result = run_worker(handle)
    assert result.returncode != 0
    rows = _failures(handle.db_url, handle.spec.trial_id)
    # Both ranks raise at the same batch; whichever got there, it had trained 3 batches.
    assert rows and {(r["type"], r["message"], r["steps"]) for r in rows} == {
        ("RuntimeError", "loss exploded at batch 3", 3)
    }, result.stderr


@pytest.mark.slow
def test_unresolvable_entrypoint_is_recorded_as_an_invalid_trial(
    make_trial: Callable[..., TrialHandle],
) -> None:
    handle = make_trial(entrypoint="failing_trials:NoSuchTrial", slots_per_trial=1)
    result = run_worker(handle, nproc=1)
    assert result.returncode != 0
    rows = _failures(handle.db_url, handle.spec.trial_id)
    assert [(r["rank"], r["type"], r["message"]) for r in rows] == [
        (0, "InvalidTrialError", "entrypoint: module 'failing_trials' has no 'NoSuchTrial'")
    ], result.stderr


def test_the_drivers_lines_carry_their_prefix(tmp_path: Path) -> None:
    from trials.launch.launcher import write_log_line

    log = tmp_path / "logs" / "trial.log"
    write_log_line(log, "trial 3.1 attempt 0 on agent local, slots 0,1")
    write_log_line(log, "two\nlines")
    assert log.read_text() == (
        "[slotsweep] trial 3.1 attempt 0 on agent local, slots 0,1\n"
        "[slotsweep] two\n[slotsweep] lines\n"
    )
