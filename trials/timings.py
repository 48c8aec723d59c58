"""The clocks of every search on a cluster: heartbeats, leases and grace periods.

The defaults suit a real cluster: a driver writes its heartbeat every 2 s, a slot claim
it stops renewing is given up after 30 s, a driver silent for 20 s is taken as dead.
Drivers judge *each other* by these clocks (a decision drops the queue entries of a
driver whose heartbeat is older than the lease), so every process of one cluster must
use the same values. They are therefore read from the environment, which the driver,
the CLI, the UI and the trials all inherit, not from one experiment's config:
``SLOTSWEEP_TIMINGS="lease_s=6,driver_stale_after_s=4,heartbeat_every_s=0.5"``
overrides the fields it names. Tests use it so that a lost driver is noticed in
seconds instead of waiting out the defaults; a site with slow storage may raise them.

Example:
    >>> parse_timings("lease_s=6, heartbeat_every_s=0.5").lease_s
    6.0
    >>> parse_timings("lease=6")
    Traceback (most recent call last):
    ...
    trials.timings.TimingsError: SLOTSWEEP_TIMINGS: unknown field 'lease'; allowed: heartbeat_every_s, lease_s, driver_stale_after_s, preempt_grace_s, startup_allowance_s, kill_grace_s, exit_grace_s
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

TIMINGS_ENV_VAR = "SLOTSWEEP_TIMINGS"
# A week: past that a value is a typo, and timedelta arithmetic stays far from overflow.
_MAX_SECONDS = 604_800.0


class TimingsError(ValueError):
    """``SLOTSWEEP_TIMINGS`` is malformed; the message is the one line to show."""


@dataclass(frozen=True)
class Timings:
    """The driver's clocks, in seconds."""

    #: How often a driver writes its heartbeat, renews its leases and looks for hangs.
    heartbeat_every_s: float = 2.0
    #: How long a slot claim (and a driver's place in the queue) holds unrenewed.
    lease_s: float = 30.0
    #: A driver whose heartbeat is older than this is taken as gone (pause, kill, UI).
    driver_stale_after_s: float = 20.0
    #: How long a preempted trial may take to checkpoint and exit before it is killed.
    preempt_grace_s: float = 120.0
    #: The least time a run gets before its first record (start-up is no hang).
    startup_allowance_s: float = 120.0
    #: How long a killed trial gets after SIGTERM (rank 0 commits what it queued).
    kill_grace_s: float = 10.0
    #: How long a trial's processes get to exit once its rank 0 has recorded its end
    #: (finished or pruned); past it they are ended and the trial keeps that end.
    exit_grace_s: float = 60.0


_FIELDS = tuple(field.name for field in dataclasses.fields(Timings))


def parse_timings(text: str) -> Timings:
    """The :class:`Timings` that ``text`` (``name=seconds`` pairs, comma-separated) sets.

    Fields not named keep their defaults. Raises :class:`TimingsError` naming the
    field and what is allowed.
    """
    values: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, raw = (part.strip() for part in item.partition("="))
        if name not in _FIELDS:
            raise TimingsError(
                f"{TIMINGS_ENV_VAR}: unknown field {name!r}; allowed: {', '.join(_FIELDS)}"
            )
        try:
            seconds = float(raw) if sep else math.nan
        except ValueError:
            seconds = math.nan
        if not 0 < seconds <= _MAX_SECONDS:
            raise TimingsError(
                f"{TIMINGS_ENV_VAR}: {name} must be a number of seconds above 0 and at most "
                f"{_MAX_SECONDS:g} (got {raw!r})"
            )
        values[name] = seconds
    timings = Timings(**values)
    slowest_renewal = timings.heartbeat_every_s
    for name in ("lease_s", "driver_stale_after_s"):
        if getattr(timings, name) <= slowest_renewal:
            # A lease shorter than the heartbeat expires between two renewals.
            raise TimingsError(
                f"{TIMINGS_ENV_VAR}: {name} must be longer than heartbeat_every_s "
                f"({getattr(timings, name):g} <= {slowest_renewal:g})"
            )
    return timings


def timings_from_env(env: Mapping[str, str] | None = None) -> Timings:
    """The timings this process runs with: the defaults, overridden by ``SLOTSWEEP_TIMINGS``."""
    return _parse_once((os.environ if env is None else env).get(TIMINGS_ENV_VAR, ""))


def lease_timings(lease_s: float) -> str:
    """The ``SLOTSWEEP_TIMINGS`` value for a lease of ``lease_s`` seconds.

    The heartbeat comes at least four times per lease, and a driver is taken as gone
    after as long as the lease (or the default, when that is longer), so a short lease
    is renewed in time. For tests and benchmarks that stop drivers on purpose.

    Example:
        >>> lease_timings(3)
        'lease_s=3,heartbeat_every_s=0.75,driver_stale_after_s=20'
    """
    defaults = Timings()
    heartbeat_s = min(defaults.heartbeat_every_s, lease_s / 4)
    stale_s = max(defaults.driver_stale_after_s, lease_s)
    return (
        f"lease_s={lease_s:g},heartbeat_every_s={heartbeat_s:g},driver_stale_after_s={stale_s:g}"
    )


# Read on every liveness check: each distinct value is parsed once.
_parse_once = functools.lru_cache(maxsize=8)(parse_timings)
