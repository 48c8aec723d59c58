"""The driver's clocks from ``SLOTSWEEP_TIMINGS``: defaults, overrides, one-line refusals."""

from __future__ import annotations

import pytest

from trials.timings import Timings, TimingsError, parse_timings, timings_from_env


def test_unset_or_empty_gives_the_defaults() -> None:
    assert timings_from_env({}) == Timings()
    assert parse_timings("") == parse_timings(" , ") == Timings()


def test_named_fields_override_the_defaults_and_the_rest_stay() -> None:
    timings = timings_from_env(
        {"SLOTSWEEP_TIMINGS": "lease_s=6, driver_stale_after_s=4,heartbeat_every_s=0.5"}
    )
    assert timings == Timings(lease_s=6.0, driver_stale_after_s=4.0, heartbeat_every_s=0.5)
    assert timings.preempt_grace_s == Timings().preempt_grace_s


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("lease=3", "SLOTSWEEP_TIMINGS: unknown field 'lease'; allowed: heartbeat_every_s,"),
        ("lease_s", "SLOTSWEEP_TIMINGS: lease_s must be a number of seconds above 0"),
        ("lease_s=abc", "SLOTSWEEP_TIMINGS: lease_s must be a number of seconds above 0"),
        ("kill_grace_s=0", "SLOTSWEEP_TIMINGS: kill_grace_s must be a number of seconds"),
        ("kill_grace_s=nan", "SLOTSWEEP_TIMINGS: kill_grace_s must be a number of seconds"),
        ("kill_grace_s=1e9", "SLOTSWEEP_TIMINGS: kill_grace_s must be a number of seconds"),
        ("lease_s=1", "SLOTSWEEP_TIMINGS: lease_s must be longer than heartbeat_every_s (1 <= 2)"),
        (
            "heartbeat_every_s=25",
            "SLOTSWEEP_TIMINGS: driver_stale_after_s must be longer than heartbeat_every_s",
        ),
    ],
)
def test_a_malformed_value_is_one_line_naming_the_field(text: str, problem: str) -> None:
    with pytest.raises(TimingsError) as info:
        parse_timings(text)
    assert str(info.value).startswith(problem)
    assert "\n" not in str(info.value)
