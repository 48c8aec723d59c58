"""The soak benchmark: its figures on a hand-written database, and a real quick soak."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from soak import SoakResult, slot_seconds, soak_config, soak_line

from searcher import check_consistency, parse_config
from storage import ProcessRole, TrialProcess, TrialRun, session_scope
from tests.conftest import REPO_ROOT, add_experiment, cli_environment

T0 = dt.datetime(2026, 1, 1)
LAST_LINE = re.compile(
    r"trials=(\d+) trials_per_min=(\d+\.\d+) utilization=(\d+\.\d+) restarts=(\d+) "
    r"overlaps=(\d+) consistent=(true|false)"
)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _torchrun(url: str, trial_id: int, slots: list[int], start: float, end: float | None) -> None:
    with session_scope(url) as session:
        run = TrialRun(trial_id=trial_id, attempt=0, started_at=_at(start))
        session.add(run)
        session.flush()
        session.add(
            TrialProcess(
                run_id=run.id,
                trial_id=trial_id,
                attempt=0,
                role=ProcessRole.TORCHRUN,
                agent="local",
                host="127.0.0.1",
                slots=slots,
                pid=100 + trial_id,
                create_time=start,
                started_at=_at(start),
                ended_at=None if end is None else _at(end),
            )
        )


def test_slot_seconds_count_each_torchrun_within_the_window(db_url: str) -> None:
    _, (two_slots, one_slot, unended) = add_experiment(db_url, [{}, {}, {}])
    _torchrun(db_url, two_slots, [0, 1], 5, 15)  # 2 x 10
    _torchrun(db_url, one_slot, [2], 0, 30)  # clipped to the window: 1 x 20
    _torchrun(db_url, unended, [3], 20, None)  # counts up to the end: 1 x 5
    assert slot_seconds(db_url, _at(5), _at(25)) == pytest.approx(20 + 20 + 5)


def test_the_last_line_has_the_documented_shape(db_url: str) -> None:
    result = SoakResult(
        trials=6,
        wall_s=120.0,
        slots=4,
        slot_seconds=240.0,
        kills=Counter(driver=1, torchrun=1, rank=1),
        self_exits=0,
        leftovers=0,
        report=check_consistency(db_url),
    )
    assert soak_line(result) == (
        "trials=6 trials_per_min=3.00 utilization=0.500 restarts=0 overlaps=0 consistent=true"
    )


def test_soak_experiments_are_valid_configs(tmp_path: Path) -> None:
    configs = [soak_config(i, max_trials=50, seed=7, checkpoints=tmp_path / "c") for i in range(4)]
    parsed = [parse_config(config) for config in configs]
    # Shares of one slot among whole-slot trials (issue 52).
    assert [c.resources.slots_per_trial for c in parsed] == [0.5, 1, 2, 0.25]
    assert len({c.name for c in parsed}) == 4
    assert len({c.searcher.seed for c in parsed}) == 4


@pytest.mark.slow
def test_quick_soak_ends_consistent(tmp_path: Path) -> None:
    env = cli_environment()
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "soak.py"), "--quick", "--seed", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    match = LAST_LINE.fullmatch(last)
    assert match, last
    trials, _, utilization, _, overlaps, consistent = match.groups()
    assert int(trials) == 6
    assert 0.0 < float(utilization) <= 1.0
    assert (overlaps, consistent) == ("0", "true"), result.stdout[-4000:]
