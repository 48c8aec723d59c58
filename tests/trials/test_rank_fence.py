"""The fenced rank start against the side that judges a run gone, in both orders.

Issue 26: a driver stopped between recording a run and starting its processes may
lose the run's slot claim meanwhile; its ranks must then exit before touching a device.
Each rank passes ``storage.start_ranks`` first (the run not ended, its claim held, the
run marked started, one transaction), and whoever judges the run gone (a decision's
``reclaim_stale``, resume's ``end_leftovers``) reads it locked in its own write
transaction. Played here on real databases (SQLite and PostgreSQL) with a real process
standing in for a started rank: sequentially in both orders, then with the two
transactions overlapping, each order once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from storage import (
    FENCED_EXIT_CODE,
    Allocation,
    RanksFencedError,
    TrialRun,
    session_scope,
    start_ranks,
    upgrade_schema,
    utcnow,
)
from tests.conftest import POSTGRESQL, add_experiment
from trials.coordination import allocations
from trials.coordination.attempts import end_run, open_runs, trial_processes_gone
from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR
from trials.scheduler import Agent, AgentSlots, Placement

A0 = Agent("a0", "127.0.0.1", (0,))
# How long an overlapping transaction must have waited to count as blocked.
BLOCKED_S = 0.5


@pytest.fixture(params=["sqlite", POSTGRESQL])
def url(request: pytest.FixtureRequest, db_url: str) -> str:
    if request.param == "sqlite":
        return db_url
    postgres: str = request.getfixturevalue("postgres_url")
    upgrade_schema(postgres)
    return postgres


def _recorded_run(url: str) -> tuple[int, str]:
    """A trial whose driver recorded its run on a claim whose lease has expired, and
    then stopped before starting anything; (trial id, the run's launch token).

    The experiment names no driver: nothing but the run's own state keeps a judge from
    calling it gone.
    """
    experiment_id, (trial_id,) = add_experiment(url, [{}])
    token = f"fence-{uuid.uuid4().hex}"
    where = Placement(trial_id, "default", (AgentSlots(A0, (0,)),))
    with session_scope(url) as session:
        claim = allocations.claim(
            session, where, trial_id=trial_id, experiment_id=experiment_id, lease_s=-1
        )
        session.add(
            TrialRun(
                trial_id=trial_id,
                attempt=0,
                agents=[{"agent": "a0", "host": "127.0.0.1", "slots": [0]}],
                launch_token=token,
                claim_token=claim,
            )
        )
    return trial_id, token


def _reclaim(url: str) -> list[int]:
    """A placement decision's reclaim of expired leases (its own transaction)."""
    with session_scope(url) as session:
        return allocations.reclaim_stale(
            session, utcnow(), processes_gone=lambda t: trial_processes_gone(session, t)
        )


def _start(url: str, trial_id: int) -> int | None:
    with session_scope(url) as session:
        return start_ranks(session, trial_id, 0)


def _started_at(url: str, trial_id: int) -> Any:
    with session_scope(url) as session:
        return session.scalar(
            select(TrialRun.ranks_started_at).where(TrialRun.trial_id == trial_id)
        )


def _held(url: str) -> list[int]:
    with session_scope(url) as session:
        return list(session.scalars(select(Allocation.trial_id)))


@pytest.fixture
def rank() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Starts a process carrying a launch token, as a started rank does; ends them after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(token: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"],
            env={**os.environ, LAUNCH_TOKEN_ENV_VAR: token},
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_reclaim_first_fences_the_ranks_out(url: str) -> None:
    trial_id, _ = _recorded_run(url)
    assert _reclaim(url) == [trial_id]
    with pytest.raises(RanksFencedError, match="its slot claim is gone"):
        _start(url, trial_id)
    assert _started_at(url, trial_id) is None


def test_a_resume_ending_the_run_first_fences_the_ranks_out(url: str) -> None:
    trial_id, _ = _recorded_run(url)
    with session_scope(url) as session:
        for run in open_runs(session, trial_id):
            assert end_run(session, run, reason="driver stopped")
        allocations.release(session, trial_id)
    with pytest.raises(RanksFencedError, match="the run was ended"):
        _start(url, trial_id)
    assert _started_at(url, trial_id) is None


def test_ranks_first_keep_the_slot_until_their_processes_are_gone(
    url: str, rank: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    trial_id, token = _recorded_run(url)
    process = rank(token)
    assert _start(url, trial_id) is not None
    assert _started_at(url, trial_id) is not None
    assert _reclaim(url) == [] and _held(url) == [trial_id]
    process.kill()
    process.wait()
    assert _reclaim(url) == [trial_id] and _held(url) == []


def _in_thread(body: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = body()
        except BaseException as error:  # handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_ranks_checking_while_a_reclaim_is_open_wait_and_are_fenced(url: str) -> None:
    trial_id, _ = _recorded_run(url)
    judged = threading.Event()
    commit = threading.Event()

    def reclaim() -> list[int]:
        with session_scope(url) as session:
            reclaimed = allocations.reclaim_stale(
                session, utcnow(), processes_gone=lambda t: trial_processes_gone(session, t)
            )
            judged.set()
            assert commit.wait(30)
        return reclaimed

    judge, judged_outcome = _in_thread(reclaim)
    assert judged.wait(30)
    ranks, ranks_outcome = _in_thread(lambda: _start(url, trial_id))
    time.sleep(BLOCKED_S)
    assert ranks.is_alive(), ranks_outcome  # waits for the judgement's transaction
    commit.set()
    judge.join(30)
    ranks.join(30)
    assert judged_outcome == {"value": [trial_id]}
    assert isinstance(ranks_outcome.get("error"), RanksFencedError)
    assert _started_at(url, trial_id) is None and _held(url) == []


def test_a_reclaim_while_the_ranks_check_is_open_waits_and_sees_them_started(
    url: str, rank: Callable[[str], subprocess.Popen[bytes]]
) -> None:
    trial_id, token = _recorded_run(url)
    checked = threading.Event()
    commit = threading.Event()

    def ranks_start() -> int | None:
        with session_scope(url) as session:
            run_id = start_ranks(session, trial_id, 0)
            checked.set()
            assert commit.wait(30)
        return run_id

    ranks, ranks_outcome = _in_thread(ranks_start)
    assert checked.wait(30)
    rank(token)  # the rank that passed the check runs
    judge, judged_outcome = _in_thread(lambda: _reclaim(url))
    time.sleep(BLOCKED_S)
    assert judge.is_alive(), judged_outcome  # waits for the ranks' transaction
    commit.set()
    ranks.join(30)
    judge.join(30)
    assert "error" not in ranks_outcome, ranks_outcome
    assert judged_outcome == {"value": []}
    assert _started_at(url, trial_id) is not None and _held(url) == [trial_id]


def test_torchrun_passes_on_the_fenced_exit_of_its_first_failing_rank() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from storage import FENCED_EXIT_CODE
    from trials.node.torchrun import ranks_fenced

    def failed(*codes: int) -> ChildFailedError:
        failures = {
            rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="")
            for rank, code in enumerate(codes)
        }
        return ChildFailedError("worker", failures)

    assert ranks_fenced(failed(FENCED_EXIT_CODE))
    assert ranks_fenced(failed(FENCED_EXIT_CODE, FENCED_EXIT_CODE))
    assert not ranks_fenced(failed(1))
    assert not ranks_fenced(RuntimeError("the rendezvous failed"))


# A node's torchrun wrapper passes the fence once for its ranks (trials.node._fence),
# in a child forked beside its torch import; each part runs in a fresh interpreter, as
# the wrapper and the ranks do (no fork of the test's own process).
_WRAPPER = """
import json, os, sys
from trials.launch.launcher import spec_from_environment
from trials.node._fence import FENCE_PASSED_ENV_VAR, NodeFence
fence = NodeFence(spec_from_environment())
verdict = fence.verdict()
print(json.dumps([verdict, os.environ.get(FENCE_PASSED_ENV_VAR), "storage" in sys.modules]))
"""
# A rank whose wrapper passed the fence: what it imports up to the runtime's import.
_RANK = """
import json, sys
import trials.node.worker
from trials.launch.launcher import spec_from_environment
from trials.node._fence import rank_fenced_start
verdict = rank_fenced_start(spec_from_environment())
heavy = ("storage", "sqlalchemy", "psycopg", "optuna", "alembic", "torch", "streamlit")
print(json.dumps([verdict, sorted(m for m in heavy if m in sys.modules)]))
"""


def _spec_env(url: str, trial_id: int, **extra: str) -> dict[str, str]:
    from trials.launch.launcher import SPEC_ENV_VAR

    spec = {
        "db_url": url,
        "experiment_id": 1,
        "checkpoint_folder": "1",
        "trial_id": trial_id,
        "study_name": "s",
        "optuna_trial_id": 0,
        "optuna_trial_number": 0,
        "entrypoint": "model:Trial",
        "model_dir": ".",
        "hparams": {},
        "slots_per_trial": 1,
        "max_length": {"batches": 1},
        "searcher_metric": "loss",
        "min_validation_period": {"batches": 1},
        "scratch_dir": ".",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTSWEEP_")}
    return {**env, SPEC_ENV_VAR: json.dumps(spec), **extra}


def _python(code: str, env: dict[str, str]) -> tuple[Any, str]:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stdout + done.stderr


@pytest.mark.slow  # starts a Python process
def test_the_wrapper_passes_the_fence_for_its_ranks_and_names_the_attempt(db_url: str) -> None:
    trial_id, _ = _recorded_run(db_url)
    verdict, _ = _python(_WRAPPER, _spec_env(db_url, trial_id))
    # Passed in the child: the wrapper itself never imported storage.
    assert verdict == [None, f"{trial_id}:0", False]
    assert _started_at(db_url, trial_id) is not None


@pytest.mark.slow  # starts a Python process
def test_the_wrapper_refuses_an_ended_run_before_any_rank_starts(db_url: str) -> None:
    trial_id, _ = _recorded_run(db_url)
    with session_scope(db_url) as session:
        for run in open_runs(session, trial_id):
            assert end_run(session, run, reason="driver stopped")
    (code, marker, _), output = _python(_WRAPPER, _spec_env(db_url, trial_id))
    assert (code, marker) == (FENCED_EXIT_CODE, None)
    assert "may not start: the run was ended" in output
    assert _started_at(db_url, trial_id) is None


@pytest.mark.slow  # starts a Python process
def test_a_rank_whose_wrapper_passed_the_fence_imports_no_database_code(db_url: str) -> None:
    """The guard on the rank's start-up: only a rank that checks for itself loads them."""
    from trials.node._fence import FENCE_PASSED_ENV_VAR

    trial_id, _ = _recorded_run(db_url)
    passed = _spec_env(db_url, trial_id, **{FENCE_PASSED_ENV_VAR: f"{trial_id}:0"})
    assert _python(_RANK, passed)[0] == [None, []]
    assert _started_at(db_url, trial_id) is None  # nobody checked: the wrapper did
    # Another attempt's pass does not count: the rank checks for itself.
    other = _spec_env(db_url, trial_id, **{FENCE_PASSED_ENV_VAR: f"{trial_id}:1"})
    assert _python(_RANK, other)[0] == [None, ["sqlalchemy", "storage"]]
    assert _started_at(db_url, trial_id) is not None
