"""Rank 0's database thread: writes queued meanwhile share one transaction."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import event, select

from storage import Metric, get_engine, session_scope
from trials.runtime import _recorder_queue
from trials.runtime._recorder import ChiefRecorder

from .conftest import TrialHandle


@pytest.fixture
def recorder(make_trial: Callable[..., TrialHandle]) -> Iterator[ChiefRecorder]:
    recorder = ChiefRecorder(make_trial().spec)
    recorder.flush()
    try:
        yield recorder
    finally:
        recorder.close()


@contextlib.contextmanager
def _counted_commits(recorder: ChiefRecorder) -> Iterator[list[object]]:
    """The commits on the recorder's database while the block runs."""
    commits: list[object] = []

    def count(connection: object) -> None:
        commits.append(connection)

    engine = get_engine(recorder.spec.db_url)
    event.listen(engine, "commit", count)
    try:
        yield commits
    finally:
        event.remove(engine, "commit", count)


def _commits(recorder: ChiefRecorder, writes: Callable[[], None]) -> int:
    """How many transactions ``writes`` committed, queued while the thread was busy."""
    with _counted_commits(recorder) as commits:
        recorder.submit(lambda: time.sleep(0.2))
        writes()
    return len(commits)


def _steps(recorder: ChiefRecorder) -> list[int]:
    with session_scope(recorder.spec.db_url) as session:
        return list(
            session.scalars(
                select(Metric.step)
                .where(Metric.trial_id == recorder.spec.trial_id)
                .order_by(Metric.step)
            )
        )


def test_writes_queued_meanwhile_commit_in_one_transaction(recorder: ChiefRecorder) -> None:
    def writes() -> None:
        for step in (1, 2, 3):
            recorder.training_metrics(step, None, {"loss": 1.0 / step})
        recorder.flush()

    assert _commits(recorder, writes) == 1
    assert _steps(recorder) == [1, 2, 3]


def test_a_failing_write_fails_alone_and_the_others_commit(recorder: ChiefRecorder) -> None:
    def fails(session: object) -> None:
        raise ValueError("not this one")

    def writes() -> None:
        recorder.training_metrics(1, None, {"loss": 1.0})
        recorder.submit_write(fails)
        recorder.training_metrics(2, None, {"loss": 0.5})
        with pytest.raises(RuntimeError, match=r"an earlier database write failed.*not this one"):
            recorder.flush()

    # The three together, rolled back; then each alone: two commits.
    assert _commits(recorder, writes) == 2
    assert _steps(recorder) == [1, 2]


def test_a_write_soon_after_a_background_write_shares_its_transaction(
    recorder: ChiefRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wide window, so that a loaded machine cannot make the second write miss it.
    monkeypatch.setattr(_recorder_queue, "GROUP_COMMIT_S", 5.0)
    with _counted_commits(recorder) as commits:
        recorder.training_metrics(1, None, {"loss": 1.0})
        time.sleep(0.2)  # the thread is idle and has taken the write
        began = time.monotonic()
        assert recorder.call_write(lambda session: "the end") == "the end"
        waited = time.monotonic() - began
    # The caller's write ended the wait: it did not sit out the window.
    assert waited < 4.0
    assert len(commits) == 1
    assert _steps(recorder) == [1]


def test_a_background_write_alone_commits_once_its_window_passes(
    recorder: ChiefRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_recorder_queue, "GROUP_COMMIT_S", 0.3)
    recorder.training_metrics(1, None, {"loss": 1.0})
    assert _steps(recorder) == []  # still waiting for company
    deadline = time.monotonic() + 30.0
    while not _steps(recorder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _steps(recorder) == [1]
