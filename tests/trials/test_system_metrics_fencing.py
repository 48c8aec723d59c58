"""The system-metrics sampler of a trial attempt: fenced like rank 0, but never progress."""

from __future__ import annotations

import logging
import time

import pytest
from sqlalchemy import func, select, update

from storage import SystemMetric, TrialRun, session_scope, utcnow
from tests.conftest import add_experiment
from trials._system_metrics import SystemMetricsSampler


def _samples(db_url: str) -> int:
    with session_scope(db_url) as session:
        return int(
            session.scalar(select(func.count(func.distinct(SystemMetric.recorded_at)))) or 0
        )


def _wait_for(db_url: str, samples: int) -> None:
    deadline = time.monotonic() + 30
    while _samples(db_url) < samples:
        assert time.monotonic() < deadline, "the sampler recorded nothing"
        time.sleep(0.02)


def test_a_superseded_attempts_sampler_stops_recording_and_never_stamps_progress(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trials._system_metrics")
    _, (trial_id,) = add_experiment(db_url)
    with session_scope(db_url) as session:
        session.add(TrialRun(trial_id=trial_id, attempt=0))
    sampler = SystemMetricsSampler(
        db_url, trial_id=trial_id, agent="agent-a", interval_s=0.05, attempt=0
    )
    with sampler:
        _wait_for(db_url, samples=2)
        with session_scope(db_url) as session:
            # Sampling is no sign of training: a hung rank must still look hung.
            assert session.scalar(select(TrialRun.progress_at)) is None
            session.execute(update(TrialRun).values(ended_at=utcnow()))  # the driver's restart
            session.add(TrialRun(trial_id=trial_id, attempt=1))
        deadline = time.monotonic() + 30
        while not sampler._superseded:
            assert time.monotonic() < deadline, "the sampler never noticed attempt 1"
            time.sleep(0.02)
        recorded = _samples(db_url)
        time.sleep(0.3)
    assert _samples(db_url) == recorded  # nothing more, not even the sample taken at stop
    superseded = [r for r in caplog.records if "superseded by attempt 1" in r.getMessage()]
    assert len(superseded) == 1
