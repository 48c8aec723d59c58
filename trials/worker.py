"""The program every rank of a trial runs: ``torchrun ... -m trials.worker``.

The driver passes the trial's :class:`~trials.RuntimeSpec` as a JSON file named by
``SLOTSWEEP_TRIAL_SPEC`` and points torchrun's output at the trial's log file.

The first thing a rank does, before importing torch, is to route its stdout and stderr
(file descriptors 1 and 2, so C-level output too) through a small child process that
prefixes every line with ``[rank N] ``: the log of a multi-rank trial can then be
filtered per rank. The prefixer is a separate process reading a pipe, not a thread, so
whatever the rank wrote before a SIGKILL still reaches the log (the kernel closes the
pipe, the prefixer drains it and exits).

Exit codes: 0 when the rank's part ended as planned (finished, pruned or preempted; the
outcome itself is in the database), 2 for a trial that cannot run as configured (one
line saying why), 1 with a traceback for a crash.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

_CHUNK = 65536


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the log is gone; nothing sensible is left to do with the line
        view = view[written:]


def _pump(sources: dict[int, int], prefix: bytes) -> None:
    """Copy each source pipe to its target fd, one prefixed line per ``os.write``."""
    import select

    pending = {fd: b"" for fd in sources}
    while pending:
        try:
            readable, _, _ = select.select(list(pending), [], [])
        except InterruptedError:
            continue
        for fd in readable:
            try:
                chunk = os.read(fd, _CHUNK)
            except InterruptedError:
                continue
            if not chunk:
                if pending[fd]:
                    _write_all(sources[fd], prefix + pending[fd] + b"\n")
                del pending[fd]
                os.close(fd)
                continue
            *lines, rest = (pending[fd] + chunk).split(b"\n")
            pending[fd] = rest
            if lines:
                _write_all(sources[fd], b"".join(prefix + line + b"\n" for line in lines))


def prefix_output(prefix: str) -> tuple[int, int, int]:
    """Route fds 1 and 2 through a prefixing child; ``(child pid, saved stdout, saved stderr)``."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the prefixer: drains until every writer has closed its end
        try:
            os.close(out_w)
            os.close(err_w)
            # torchrun signals the whole group on shutdown; the prefixer must outlive
            # the rank long enough to write its last lines.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _pump({out_r: 1, err_r: 2}, prefix.encode())
        finally:
            os._exit(0)
    os.close(out_r)
    os.close(err_r)
    saved_out, saved_err = os.dup(1), os.dup(2)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    # Line-buffer Python's own streams: a line printed is a line in the pipe, even
    # if the process is killed right after.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return pid, saved_out, saved_err


def stop_prefixing(pid: int, saved_out: int, saved_err: int, timeout_s: float = 10.0) -> None:
    """Close the pipes and wait (bounded) until the prefixer has written everything."""
    import time

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.dup2(saved_out, 1)
    os.dup2(saved_err, 2)
    os.close(saved_out)
    os.close(saved_err)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)


def _fail(message: str) -> int:
    print(f"slotsweep: {message}", file=sys.stderr, flush=True)
    return 2


def _run() -> int:
    import signal

    from pydantic import ValidationError

    from trials._config import RuntimeSpec
    from trials._validation import validation_problems

    spec_path = os.environ.get("SLOTSWEEP_TRIAL_SPEC")
    if not spec_path:
        return _fail(
            "SLOTSWEEP_TRIAL_SPEC: not set; it must name the trial's RuntimeSpec JSON file"
        )
    try:
        with open(spec_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        return _fail(f"SLOTSWEEP_TRIAL_SPEC: cannot read {spec_path}: {error.strerror}")
    try:
        spec = RuntimeSpec.model_validate_json(text)
    except ValidationError as error:
        for problem in validation_problems(error, RuntimeSpec):
            _fail(f"SLOTSWEEP_TRIAL_SPEC {spec_path}: {problem}")
        return 2

    def _terminate(signum: int, _frame: object) -> None:
        # Unwind normally, so rank 0 commits its queued records and the group is left.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    # c10d assigns ranks in arrival order; say which one this process got.
    print(
        f"slotsweep: trial {spec.trial_id} attempt {spec.attempt}: rank "
        f"{os.environ.get('RANK', '0')} of world_size {os.environ.get('WORLD_SIZE', '1')} "
        f"(local rank {os.environ.get('LOCAL_RANK', '0')}) on agent "
        f"{os.environ.get('SLOTSWEEP_AGENT', spec.agent)}",
        flush=True,
    )

    from torch.distributed.elastic.multiprocessing.errors import record

    from trials.runtime._context import InvalidTrialError
    from trials.runtime._runner import run_trial

    try:
        outcome = record(run_trial)(spec)
    except InvalidTrialError as error:
        return _fail(str(error))
    print(f"slotsweep: trial {spec.trial_id} attempt {spec.attempt}: {outcome}", flush=True)
    return 0


def main() -> int:
    prefixer = prefix_output(f"[rank {os.environ.get('RANK', '0')}] ")
    try:
        return _run()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        # Printed here, while the output is still prefixed with the rank.
        import traceback

        traceback.print_exc()
        return 1
    finally:
        stop_prefixing(*prefixer)


def exit_without_teardown(code: int) -> NoReturn:
    """Exit with ``code`` after the atexit handlers, skipping the interpreter's teardown.

    Call it once the process group is left and the records are committed. Tearing down
    torch's modules costs about a second per rank, on every trial of a search, and can
    abort a finished rank: gloo's worker threads outlive ``destroy_process_group`` and
    finalization sometimes ends them with ``terminate called without an active
    exception`` (SIGABRT), which torchrun reports as a failed job. User code's atexit
    handlers still run; only module teardown is skipped.
    """
    import atexit

    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
