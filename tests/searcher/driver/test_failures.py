"""Which failures are worth a restart, and when an experiment stops (pure, quick)."""

from __future__ import annotations

from searcher.driver.failures import (
    FailureRecord,
    TrialOutcome,
    fail_fast_reason,
    is_port_clash,
    judge_run,
)
from storage import TrialFailure


def _failure(rank: int, message: str = "bad shape", steps: int = 0) -> FailureRecord:
    return FailureRecord(rank, "ValueError", message, steps)


def test_the_same_error_before_any_step_is_deterministic() -> None:
    verdict = judge_run([_failure(1), _failure(0)], world_size=2)
    assert verdict is not None
    assert verdict.deterministic
    assert verdict.reason == "ValueError: bad shape"  # which rank came first is chance
    assert verdict.signature == ("ValueError", "bad shape")
    # torchrun ended rank 1 before it got as far: still the same bug.
    alone = judge_run([_failure(0)], world_size=2)
    assert alone is not None and alone.deterministic


def test_failures_worth_a_restart() -> None:
    # A rank that made progress first: bad luck, not a bug.
    progressed = judge_run([_failure(0, steps=3), _failure(1)], world_size=2)
    assert progressed is not None and not progressed.deterministic
    assert progressed.reason == "ValueError: bad shape (rank 0)"
    # Different errors: one rank's bug or bad luck, the other saw it leave.
    mixed = judge_run([_failure(0), _failure(1, "peer left")], world_size=2)
    assert mixed is not None and not mixed.deterministic
    # What the survivors of a killed rank see is never a bug.
    gloo = FailureRecord(0, "RuntimeError", "[gloo] Connection reset by peer", 0)
    assert not judge_run([gloo], world_size=2).deterministic  # type: ignore[union-attr]
    dist = FailureRecord(0, "DistBackendError", "NCCL error", 0)
    assert not judge_run([dist], world_size=2).deterministic  # type: ignore[union-attr]
    # Nothing recorded (SIGKILL): no verdict, the exit code speaks.
    assert judge_run([], world_size=2) is None


def test_the_experiment_stops_when_its_first_trials_fail_alike() -> None:
    same = ("ValueError", "bad shape")
    failed = [TrialOutcome(n, False, same) for n in range(3)]
    reason = fail_fast_reason(failed, 3)
    assert reason is not None
    assert "first 3 trials" in reason and "ValueError: bad shape" in reason
    # Not yet: a trial still runs; turned off; fewer than N finished.
    assert fail_fast_reason([*failed[:2], TrialOutcome(2, None)], 3) is None
    assert fail_fast_reason(failed, 0) is None
    assert fail_fast_reason(failed[:2], 3) is None


def test_the_experiment_goes_on_after_a_success_or_different_errors() -> None:
    same = ("ValueError", "bad shape")
    failed = [TrialOutcome(n, False, same) for n in range(3)]
    assert fail_fast_reason([*failed, TrialOutcome(7, True)], 3) is None
    mixed = [*failed[:2], TrialOutcome(2, False, ("OSError", "disk"))]
    assert fail_fast_reason(mixed, 3) is None
    # Only the first N by number count, whatever order they finished in.
    late = [TrialOutcome(5, False, ("OSError", "disk")), *failed]
    assert fail_fast_reason(late, 3) is not None


_CLASH = (
    "The server socket has failed to listen on any local network address. port: 41234, "
    "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
)


def test_a_port_taken_before_the_run_started_is_a_port_clash() -> None:
    rank = FailureRecord(0, "DistNetworkError", _CLASH, 0)
    assert is_port_clash(rank)
    # torchrun's own record (its rendezvous port), and an older torch's RuntimeError.
    torchrun = FailureRecord(TrialFailure.TORCHRUN_RANK, "DistNetworkError", _CLASH, 0)
    assert is_port_clash(torchrun) and torchrun.who == "torchrun"
    assert is_port_clash(FailureRecord(0, "RuntimeError", "Address already in use", 0))
    # The siblings saw their peer leave: still the clash.
    sibling = FailureRecord(1, "DistStoreError", "Socket Timeout", 0)
    verdict = judge_run([rank, sibling], world_size=2)
    assert verdict is not None and verdict.port_clash and not verdict.deterministic
    assert verdict.reason == f"DistNetworkError: {_CLASH} (rank 0)"
    alone = judge_run([torchrun], world_size=4)
    assert alone is not None and alone.port_clash
    assert alone.reason == f"DistNetworkError: {_CLASH} (torchrun)"


def test_a_port_taken_after_steps_or_by_the_users_code_is_no_port_clash() -> None:
    # After steps, the run had its ports: whatever failed later is no start-up race.
    assert not is_port_clash(FailureRecord(0, "DistNetworkError", _CLASH, 5))
    # The user's own server on a fixed port would fail alike every time.
    users = FailureRecord(0, "OSError", "[Errno 98] Address already in use", 0)
    assert not is_port_clash(users)
    assert not judge_run([users], world_size=1).port_clash  # type: ignore[union-attr]
    # A clash next to another error is that error's run.
    clash = FailureRecord(0, "DistNetworkError", _CLASH, 0)
    bug = FailureRecord(1, "ValueError", "bad shape", 0)
    assert not judge_run([clash, bug], world_size=2).port_clash  # type: ignore[union-attr]
    gloo = FailureRecord(0, "RuntimeError", "[gloo] Connection reset by peer", 0)
    assert not judge_run([gloo], world_size=2).port_clash  # type: ignore[union-attr]
