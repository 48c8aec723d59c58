"""Human units for the numbers the runtime records under machine-friendly names.

System metrics are stored as the sampler measured them (``net_recv_bytes_s`` in
bytes per second, ``memory_used_gb`` in 10^9 bytes); charts show MB/s, GiB and %.
The unit is read from the name's suffix, so a metric added to the sampler later gets
a unit as soon as its name follows the same convention.

Example:
    >>> unit = system_unit("net_recv_bytes_s")
    >>> unit.label, round(unit.scale * 11070004.8753, 2)
    ('MB/s', 11.07)
    >>> system_unit("memory_used_gb").label
    'GiB'
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Unit:
    """Multiply a stored value by ``scale`` to read it in ``label``; ``axis_format`` is d3's."""

    label: str
    scale: float = 1.0
    axis_format: str = ",.4~g"


_GB_TO_GIB = 1e9 / 2**30
_SUFFIXES: tuple[tuple[str, Unit], ...] = (
    ("_bytes_s", Unit("MB/s", 1e-6, ",.1f")),
    ("_percent", Unit("%", 1.0, ".0f")),
    ("_gb", Unit("GiB", _GB_TO_GIB, ",.2f")),
    ("_iops", Unit("ops/s", 1.0, ",.0f")),
    ("_watts", Unit("W", 1.0, ",.0f")),
    ("_celsius", Unit("°C", 1.0, ".0f")),
)
# Metric names without a unit suffix that still have a unit.
_NAMED = {"disk_iops": Unit("ops/s", 1.0, ",.0f")}


def system_unit(name: str) -> Unit:
    """The display unit of system metric ``name`` (a plain number if none is known)."""
    if name in _NAMED:
        return _NAMED[name]
    for suffix, unit in _SUFFIXES:
        if name.endswith(suffix):
            return unit
    return Unit("")


def titled(name: str, unit: Unit) -> str:
    """``'net_recv_bytes_s'`` -> ``'net recv (MB/s)'``: an axis title in words and unit."""
    words = name
    for suffix in ("_bytes_s", "_percent", "_gb", "_watts", "_celsius"):
        words = words.removesuffix(suffix)
    words = words.replace("_", " ")
    return f"{words} ({unit.label})" if unit.label else words


def duration_words(seconds: float) -> str:
    """A duration as a person says it: ``'45 s'``, ``'12 min'``, ``'5 h'``, ``'3 days'``.

    Example:
        >>> duration_words(42.4), duration_words(600), duration_words(7200), duration_words(3e5)
        ('42 s', '10 min', '2 h', '3 days')
    """
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
