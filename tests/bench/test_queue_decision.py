"""The database decision benchmark on a small queue: it runs, places, and keeps the rest."""

from __future__ import annotations

import re

import pytest
import queue_decision


def test_small_queue_decisions_print_their_latency(capsys: pytest.CaptureFixture[str]) -> None:
    assert queue_decision.main(["--queued", "300", "--agents", "4", "--decisions", "5"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.fullmatch(
        r"decision_p50_ms=([\d.]+) decision_p99_ms=([\d.]+) read_p50_ms=([\d.]+) "
        r"ratio=([\d.]+) queue=(\d+)",
        last,
    )
    assert found, last
    p50, p99 = float(found.group(1)), float(found.group(2))
    assert 0 < p50 <= p99
    # Each decision follows one ended trial, so it may place a few (at most the 8 slots
    # of an agent): the placed ones leave the queue, the others stay.
    assert 300 - 5 * 8 <= int(found.group(5)) <= 300
