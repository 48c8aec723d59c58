"""A trial's processes as one unit: identity by pid and start time, ending whole trees."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from trials.launch.launcher import NodeCommand, start_trial
from trials.launch.processes import (
    LAUNCH_TOKEN_ENV_VAR,
    ProcessRef,
    end_processes,
    is_alive,
    processes_with_token,
    remove_torchrun_log_dirs,
    torchrun_log_prefix,
)

# A stand-in for torchrun: it starts a "rank" in a session of its own (as torch's
# elastic agent does), and the rank starts a child of its own (a line prefixer).
_TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    rank = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time;"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
         "time.sleep(600)"],
        start_new_session=True,
    )
    print(rank.pid, flush=True)
    time.sleep(600)
    """
)


def _wait_for(predicate: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_process_is_named_by_pid_and_start_time() -> None:
    me = ProcessRef.of(os.getpid())
    assert is_alive(me) is True
    # Same pid, other start time: a recycled pid is somebody else's process.
    assert is_alive(ProcessRef(me.host, me.pid, me.create_time - 3600)) is False
    assert is_alive(ProcessRef("gpu-node-17.example", me.pid, me.create_time)) is None


def test_gone_process_is_not_alive() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcessRef.of(process.pid)
    process.wait()
    assert is_alive(ref) is False


@pytest.mark.slow
def test_ending_a_launcher_ends_ranks_in_their_own_sessions_and_their_children() -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    assert launcher.stdout is not None
    rank_pid = int(launcher.stdout.readline())
    rank = psutil.Process(rank_pid)
    assert os.getsid(rank_pid) == rank_pid != os.getsid(launcher.pid)
    assert _wait_for(lambda: len(rank.children()) == 1)
    tree = [psutil.Process(launcher.pid), rank, *rank.children()]

    survivors = end_processes([ProcessRef.of(launcher.pid)], grace_s=2.0)

    launcher.wait(timeout=5)
    assert survivors == []
    assert _wait_for(lambda: not any(p.is_running() and p.status() != "zombie" for p in tree))


@pytest.mark.slow
def test_the_launch_token_finds_processes_whose_pid_was_never_recorded(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, LAUNCH_TOKEN_ENV_VAR: token},
        start_new_session=True,
    )
    try:
        assert _wait_for(lambda: [p.pid for p in processes_with_token(token)] == [orphan.pid])
        assert end_processes([], token=token, grace_s=0.0) == []
        assert orphan.wait(timeout=5) != 0
        assert processes_with_token(token) == []
    finally:
        orphan.kill()


@pytest.mark.slow
def test_a_rank_dies_with_its_parent() -> None:
    # The parent starts a "rank" that asks for SIGKILL on its parent's death (as
    # trials.node.worker does first thing), then the parent is SIGKILLed.
    script = textwrap.dedent(
        """
        import subprocess, sys
        rank = subprocess.Popen(
            [sys.executable, "-c",
             "import time; from trials.node.worker import die_with_parent;"
             "die_with_parent(); print('ready', flush=True); time.sleep(600)"],
            start_new_session=True, stdout=subprocess.PIPE, text=True,
        )
        assert rank.stdout.readline().strip() == "ready"
        print(rank.pid, flush=True)
        import time; time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert parent.stdout is not None
    rank = ProcessRef.of(int(parent.stdout.readline()))
    parent.kill()
    parent.wait()
    assert _wait_for(lambda: is_alive(rank) is False, timeout_s=5.0)


def test_an_attempts_torchrun_log_folders_are_removed_and_no_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine, other = uuid.uuid4().hex, uuid.uuid4().hex
    left = tmp_path / f"{torchrun_log_prefix(mine)}x1y2"
    (left / "attempt_0" / "0").mkdir(parents=True)
    (left / "attempt_0" / "0" / "error.json").write_text("{}")
    others = [tmp_path / f"{torchrun_log_prefix(other)}z3", tmp_path / "torchelastic_abc"]
    for folder in others:
        folder.mkdir()
    assert remove_torchrun_log_dirs(mine) == [left]
    assert not left.exists() and all(folder.exists() for folder in others)
    assert remove_torchrun_log_dirs(mine) == []


@pytest.mark.slow
def test_the_log_folder_of_a_sigkilled_torchrun_goes_with_its_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wrapper removes its folder when torchrun returns; SIGKILLed, it cannot, and
    # the attempt's end removes it (the driver's poll of its processes).
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(600)\n")
    token = uuid.uuid4().hex
    argv = (sys.executable, "-m", "trials.node.torchrun", "--standalone", "--nnodes=1")
    command = NodeCommand(
        agent="a",
        host="127.0.0.1",
        slots=(0,),
        argv=(*argv, "--nproc-per-node=1", "--max-restarts=0", "sleeper.py"),
    )
    repo = str(Path(__file__).resolve().parents[2])
    processes = start_trial(
        [command],
        log_path=tmp_path / "trial.log",
        cwd=tmp_path,
        token=token,
        extra_env={"TMPDIR": str(temporary), "PYTHONPATH": repo},
    )
    try:
        prefix = torchrun_log_prefix(token)
        assert _wait_for(
            lambda: any(n.startswith(prefix) for n in os.listdir(temporary)), timeout_s=60.0
        ), (tmp_path / "trial.log").read_text()
        processes.processes[0].kill()
        assert _wait_for(lambda: processes.poll() is not None)
        assert processes.poll() == -9
        assert not [n for n in os.listdir(temporary) if n.startswith("slotsweep-torchrun-")]
    finally:
        processes.end(grace_s=0.0)
