"""Which failures are worth a restart, and when an experiment stops (pure, quick)."""

from __future__ import annotations

from searcher.failures import FailureRecord, TrialOutcome, fail_fast_reason, judge_run


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
