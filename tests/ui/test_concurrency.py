"""The UI must never make the running search fail with "database is locked"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._demo_data import DemoSearch
from tests.ui._pages import PageRenderer, assert_no_exception

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pages_render_while_another_process_writes(
    render: PageRenderer, writable_synthetic: DemoSearch, tmp_path: Path
) -> None:
    stop, progress = tmp_path / "stop", tmp_path / "progress"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.ui._writer",
            writable_synthetic.url,
            str(writable_synthetic.running_trial_id),
            writable_synthetic.study_name,
            str(stop),
            str(progress),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not progress.exists() and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress.exists(), "the writer never completed a write"
        started = int(progress.read_text())
        url = writable_synthetic.url
        pages: tuple[tuple[str, dict[str, Any]], ...] = (
            ("experiments", {}),
            ("experiment", {"experiment": writable_synthetic.experiment_id}),
            ("trial", {"trial": writable_synthetic.running_trial_id}),
            ("trial", {"trial": writable_synthetic.completed_trial_id}),
            ("cluster", {}),
        )
        for _ in range(2):
            for page, query in pages:
                assert_no_exception(render(page, url, **query))
            app = render("experiment", url, experiment=writable_synthetic.experiment_id)
            control = app.segmented_control(key=f"plot_kind_{writable_synthetic.experiment_id}")
            for kind in control.options:
                control.set_value(kind).run()
                assert_no_exception(app)
        assert writer.poll() is None, "the writer stopped while the pages rendered"
        ended = int(progress.read_text())
    finally:
        stop.touch()
        output, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0, output
    assert "locked" not in output
    assert ended > started, "no write happened while the pages rendered"
