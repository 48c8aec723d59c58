"""Reading the end of a trial's log without reading the whole file.

Every line a rank prints is prefixed ``[rank N] `` by the launcher, so the tail can
be filtered to one rank.

Example:
    >>> parse_rank("[rank 1] epoch 2 loss 0.31")
    1
    >>> parse_rank("torchrun: starting") is None
    True
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_RANK = re.compile(r"^\[rank (\d+)\] ")
# Enough bytes for a few thousand typical lines; a tail never reads more than this.
MAX_TAIL_BYTES = 1 << 20


def parse_rank(line: str) -> int | None:
    """The rank a log line came from, or ``None`` for lines no rank printed."""
    match = _RANK.match(line)
    return int(match.group(1)) if match else None


def tail_lines(path: str | Path, max_lines: int, max_bytes: int = MAX_TAIL_BYTES) -> list[str]:
    """The last ``max_lines`` lines of ``path``, reading at most ``max_bytes`` from its end."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        start = max(0, size - max_bytes)
        handle.seek(start)
        data = handle.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # The first line was cut by the seek.
    return lines[-max_lines:] if max_lines > 0 else []


def filter_rank(lines: list[str], rank: int | None) -> list[str]:
    """Only the lines of ``rank`` (``None``: every line)."""
    if rank is None:
        return lines
    return [line for line in lines if parse_rank(line) == rank]


def ranks_in(lines: list[str]) -> list[int]:
    """The ranks that appear in ``lines``, sorted."""
    return sorted({rank for line in lines if (rank := parse_rank(line)) is not None})


_EXCEPTION_LINE = re.compile(r"\b\w+(Error|Exception|Interrupt|Exit): ")


def last_exception_line(lines: list[str]) -> str | None:
    """The last ``SomethingError: message`` line of a log, as Python prints it last."""
    for line in reversed(lines):
        if _EXCEPTION_LINE.search(line):
            return line.strip()
    return None
