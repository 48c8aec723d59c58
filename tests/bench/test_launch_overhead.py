"""The launch-overhead benchmark's warm kind: its arithmetic on hand-written stamps, and a run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from launch_overhead import (
    FIRST_TRIAL_ONLY,
    PHASES,
    KindResult,
    local_site,
    main,
    read_jobs,
    report,
    warm_breakdown,
)

from tests.conftest import REPO_ROOT, cli_environment

WARM_LINE = re.compile(
    r"bare_s=(\d+\.\d+) cold_s=(\d+\.\d+) warm_s=(\d+\.\d+) warm_ratio=(\d+\.\d+)"
)


def _record(rank: int, pid: int, trial_id: int, at: float, cpu: float) -> dict[str, Any]:
    """Rank ``rank``'s stamps of trial ``trial_id``, which imports its module at ``at``."""
    return {
        "rank": rank,
        "trial_id": trial_id,
        "torchrun_pid": pid,
        "torchrun_start": 100.0 if pid == 1 else 200.0,
        "process_start": 102.0 if pid == 1 else 202.0,
        "module_import": at,
        "train_start": at + 0.5,
        "reported": at + 1.5,
        "cpu_train_start": cpu,
        "cpu_reported": cpu + 1.0,
        "exiting": 300.0,
        "cpu_exiting": 10.0,
    }


def _jobs() -> list[dict[int, dict[str, Any]]]:
    """Trials 1 and 2 on one warm job (torchrun 1), trial 3 on a second job (torchrun 2)."""
    plan = [(1, 1, 104.0, 2.0), (1, 2, 110.0, 5.0), (2, 3, 204.0, 2.0)]
    return [
        {rank: _record(rank, pid, trial, at, cpu) for rank in (0, 1)}
        for pid, trial, at, cpu in plan
    ]


def test_warm_trials_share_a_torchrun_pid_but_are_read_apart(tmp_path: Path) -> None:
    lines = [record for job in _jobs() for record in job.values()]
    (tmp_path / "stamps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines[::-1]))
    jobs = read_jobs(tmp_path, 3, "warm")
    assert [job[0]["trial_id"] for job in jobs] == [1, 2, 3]
    with pytest.raises(RuntimeError, match="3 of 4 trials"):
        read_jobs(tmp_path, 4, "warm")


def test_warm_phases_sum_to_each_trials_share_and_skip_what_it_lacks() -> None:
    jobs = _jobs()
    # Runs: trial 1 from 99 to 106, trial 2 handed over at 109 and back at 112; trial 3
    # on a new job, whose torchrun starts at 200, back at 207.
    spans = [(99.0, 106.0), (109.0, 112.0), (199.0, 207.0)]
    previous = [100.0, 106.0, 112.0]
    phases, cpu = warm_breakdown(previous, spans, jobs, local_site(), reaped_children_cpu=50.0)

    for trial, (since, (_, end)) in zip(phases, zip(previous, spans, strict=True), strict=True):
        assert sum(trial.values()) == pytest.approx(end - since)
    first, later, new_job = phases
    assert first[FIRST_TRIAL_ONLY] == 2.0 and new_job[FIRST_TRIAL_ONLY] == 2.0
    assert FIRST_TRIAL_ONLY not in later
    assert later["driver: reap -> launch/hand-over"] == pytest.approx(3.0)
    assert later["ranks: start/hand-over -> import"] == pytest.approx(1.0)
    assert new_job["driver: reap -> launch/hand-over"] == pytest.approx(88.0)
    assert first["recording + hand back + reap"] == pytest.approx(0.5)

    # A later trial's CPU until training starts at the previous trial's report; only a
    # job's last trial has CPU after training (the job's end).
    assert cpu[1]["rank 0 until training"] == pytest.approx(5.0 - 3.0)
    assert cpu[0]["rank 0 after training"] == 0.0
    assert cpu[1]["rank 0 after training"] == pytest.approx(10.0 - 6.0)
    # Per job, the ranks' parts add up to what the ranks used by their exit.
    for trials in (cpu[:2], cpu[2:]):
        for rank in (0, 1):
            assert sum(
                sum(v for name, v in t.items() if name.startswith(f"rank {rank}")) for t in trials
            ) == pytest.approx(10.0)
    # The reaped trees less both jobs' ranks, shared over the three trials.
    assert cpu[0]["torchrun, prefixers, exits"] == pytest.approx((50.0 - 2 * 20.0) / 3)


def _kind(per_trial: list[float], cpu: float) -> KindResult:
    site = local_site()
    return KindResult(
        per_trial=per_trial,
        phases=[dict.fromkeys(PHASES, t / len(PHASES)) for t in per_trial],
        cpu=[dict.fromkeys(site.cpu_parts, cpu) for _ in per_trial],
        whole_search=[sum(per_trial) / len(per_trial)],
        startup=[3.0],
        shutdown=[1.0],
    )


def test_the_last_line_names_the_warm_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    bare, cold = _kind([10.0, 10.0], 1.0), _kind([11.0, 11.0], 1.0)
    jobs = _jobs()
    phases, cpu = warm_breakdown(
        [100.0, 106.0], [(99.0, 106.0), (109.0, 112.0)], jobs[:2], local_site(), 30.0
    )
    warm = KindResult(
        per_trial=[6.0, 6.0],
        phases=phases,
        cpu=[{**c, "driver between trials": 0.1} for c in cpu],
        whole_search=[4.5],
        startup=[3.0],
        shutdown=[1.0],
        first_of_job=[True, False],
        jobs=[1],
    )
    report({"bare": bare, "slotsweep": cold, "warm": warm}, local_site(), k=2, rounds=1)
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == (
        "bare_s=10.000 cold_s=11.000 warm_s=6.000 warm_ratio=0.600"
    )
    assert "a job's first trial (cold start) mean 6.000 s" in out
    assert re.search(r"torchrun start-up\s+2\.000\s+n/a", out)

    report({"bare": bare, "slotsweep": cold}, local_site(), k=2, rounds=1)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "bare_s=10.000 slotsweep_s=11.000 ratio=1.100 overhead_s=1.000"


def test_warm_is_refused_where_each_trial_is_its_own_slurm_job() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--warm", "--executor", "sbatch"])
    assert exited.value.code == 2


@pytest.mark.slow
def test_a_small_warm_run_prints_all_three_kinds(tmp_path: Path) -> None:
    env = cli_environment()
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "launch_overhead.py"),
            "--warm",
            "-k",
            "2",
            "--rounds",
            "1",
            "--no-warmup",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    lines = result.stdout.strip().splitlines()
    # Both warm trials ran on one torchrun job: the second was handed over.
    assert any("round 0 warm     : 2 trials, 1 torchrun job(s)" in line for line in lines)
    found = WARM_LINE.fullmatch(lines[-1])
    assert found, lines[-1]
    bare_s, _, warm_s, _ = (float(x) for x in found.groups())
    assert bare_s > 0.0 and warm_s > 0.0
