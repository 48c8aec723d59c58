"""The worker's log prefixing, driven through real pipes in-process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trials.node._prefix import _RETARGET, _pump
from trials.node.worker import _run


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


@dataclass
class _Streams:
    """A rank's stdout and stderr (write ends), and what reached the logs once closed."""

    out: int
    err: int
    logged_out: bytes = b""
    logged_err: bytes = b""


@contextlib.contextmanager
def _pumped(prefix: bytes) -> Iterator[_Streams]:
    """The prefixer pumping a rank's two pipes into two log pipes; on leaving, the rank's
    ends are closed, the pump is awaited and what reached each log is read."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    log_out_r, log_out_w = os.pipe()
    log_err_r, log_err_w = os.pipe()
    pump = threading.Thread(target=_pump, args=({out_r: log_out_w, err_r: log_err_w}, prefix))
    pump.start()
    streams = _Streams(out_w, err_w)
    yield streams
    os.close(out_w)
    os.close(err_w)
    pump.join(timeout=10)
    os.close(log_out_w)
    os.close(log_err_w)
    streams.logged_out = read_all(log_out_r)
    streams.logged_err = read_all(log_err_r)


def test_every_line_of_both_streams_gets_the_prefix() -> None:
    with _pumped(b"[rank 3] ") as streams:
        os.write(streams.out, b"first\nsecond part")
        os.write(streams.out, b" continues\n")
        os.write(streams.err, b"an error\n")
        os.write(streams.out, b"no newline at the end")
    assert streams.logged_out == (
        b"[rank 3] first\n[rank 3] second part continues\n[rank 3] no newline at the end\n"
    )
    assert streams.logged_err == b"[rank 3] an error\n"


def test_a_retarget_line_moves_that_streams_later_lines_to_the_named_file(
    tmp_path: Path,
) -> None:
    new_log = tmp_path / "trial-2.log"
    marker = _RETARGET + str(new_log).encode() + b"\n"
    with _pumped(b"[rank 0] ") as streams:
        os.write(
            streams.out, b"trial 1's last line\nhalf a line" + marker + b"trial 2's first line\n"
        )
        os.write(streams.err, b"trial 1's error\n" + marker + b"trial 2's error\n")
    assert streams.logged_out == b"[rank 0] trial 1's last line\n[rank 0] half a line\n"
    assert streams.logged_err == b"[rank 0] trial 1's error\n"
    # Both streams go on in the new file, each in its order.
    lines = new_log.read_bytes().splitlines()
    assert sorted(lines) == [b"[rank 0] trial 2's error", b"[rank 0] trial 2's first line"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            None,
            "slotsweep: SLOTSWEEP_TRIAL_SPEC: not set; it must hold the trial's RuntimeSpec as JSON",
        ),
        ("{not json", "slotsweep: SLOTSWEEP_TRIAL_SPEC: not JSON: "),
        (
            '{"db_url": "sqlite://"}',
            "slotsweep: SLOTSWEEP_TRIAL_SPEC: entrypoint: required field is missing",
        ),
    ],
)
def test_a_bad_spec_is_one_line_per_problem_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    expected: str,
) -> None:
    if content is None:
        monkeypatch.delenv("SLOTSWEEP_TRIAL_SPEC", raising=False)
    else:
        monkeypatch.setenv("SLOTSWEEP_TRIAL_SPEC", content)
    assert _run() == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines and all(line.startswith("slotsweep: SLOTSWEEP_TRIAL_SPEC") for line in lines)
    assert any(line.startswith(expected) for line in lines)


def test_exit_without_teardown_runs_atexit_handlers_and_keeps_the_code() -> None:
    # User code's atexit handlers (and anything still buffered) must survive the fast exit.
    program = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "from trials.node.exiting import exit_without_teardown\n"
        "sys.stdout.write('buffered, no newline')\n"
        "exit_without_teardown(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "buffered, no newlinehandler ran\n"
