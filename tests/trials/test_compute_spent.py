"""A trial's compute in slot-seconds, counted from its runs' rows (pure)."""

from __future__ import annotations

import datetime as dt

from trials import RunSpan, slot_seconds_spent
from trials.config import slot_seconds_step

T0 = dt.datetime(2026, 1, 1)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_start_up_is_excluded_and_every_run_counts() -> None:
    # Run 0: launched at 0, trained from 6 s (start-up before), died after its last
    # record at 20 s; the driver noticed at 31 s. Run 1 (the restart): trained from 40 s.
    first = RunSpan(at(6), last_progress_at=at(20), ended_at=at(31))
    second = RunSpan(at(40), last_progress_at=at(52))
    assert slot_seconds_spent([first, second], slots=4, moment=at(52)) == 4 * (14 + 12)


def test_a_run_counts_only_up_to_the_moment_asked_about() -> None:
    running = RunSpan(at(10), last_progress_at=at(30))
    assert running.seconds(at(25)) == 15.0
    assert slot_seconds_spent([running], slots=2, moment=at(25)) == 30.0


def test_a_run_that_never_trained_costs_nothing() -> None:
    # Launched, but it failed before its first batch (no training_started_at).
    never = RunSpan(None, last_progress_at=at(5), ended_at=at(9))
    assert never.seconds(at(100)) == 0.0
    assert slot_seconds_spent([never, RunSpan(at(10))], slots=1, moment=at(12)) == 2.0


def test_the_count_is_the_same_when_recounted_later_from_the_same_rows() -> None:
    # What a restarted rank recounts for the earlier runs is what they spent, whatever
    # the time now: ended runs are bounded by their own rows.
    runs = [RunSpan(at(1), at(11), at(12)), RunSpan(at(20), at(25), at(26))]
    assert slot_seconds_spent(runs, 2, at(30)) == slot_seconds_spent(runs, 2, at(3000)) == 30.0


def test_optuna_steps_are_hundredths_of_a_slot_second() -> None:
    assert [slot_seconds_step(s) for s in (0.0, 0.009, 0.01, 1.0, 2.519, 0.29)] == [
        0,
        0,
        1,
        100,
        251,
        29,
    ]
