"""The pause between two trials on a warm job: from a trial's last record to the next one's first batch.

One real ``slotsweep run`` search of the digits example (``examples/digits``: its space,
model, TPE sampler and ASHA pruner) with warm workers on two warm jobs at once:
``resources: {slots_per_trial: 1, reuse_workers: true}``, ``max_concurrent_trials: 2``
on ``--slots 2``, ``max_length: {epochs: EPOCHS}`` (2 by default, so ASHA prunes at its
first rung and most trials are short), ``max_trials: N`` (40). Each warm job starts
torchrun once; every later trial on it is handed to its waiting ranks.

A hand-over is measured from the database, for every run that is not its job's first
(the job's runs share its launch token, in the order of their ids):

- from the previous run's last record (``trial_runs.progress_at``: rank 0 stamps it with
  every record it commits, and the trial's last record is its finish or its pruning),
- to the next run's first batch (``trial_runs.training_started_at``: rank 0 stamps it
  right before the first batch, its set-up done).

A hand-over is one of two kinds. Mostly the driver decided the job's next trial ahead
and rank 0 started it itself, in the transaction of its hand-back (the next run's
``started_at`` comes before the driver recorded the previous one's end): its time splits
into rank 0's hand-back and start (until ``ranks_started_at``) and the ranks' set-up of
the new trial (the reset between trials included, until ``training_started_at``).
Otherwise (no trial decided ahead, or the decision no longer stood) the driver hands the
trial over: rank 0 hands the job back and the driver sees it (previous ``ended_at``: the
driver records the hand back), the driver's turn-around (tell, ask, placement, the next
run's row and spec: the next run's ``started_at``), rank 0 picking the spec up
(``ranks_started_at``), and the ranks' set-up. The phases' medians need not add up to
the total's median.

The search runs on SQLite in a temporary folder; ``--keep`` keeps it, ``--from DB``
measures a kept database again and runs nothing.

Run:
    .venv/bin/python bench/handover.py                 # N=40, 2 epochs
    .venv/bin/python bench/handover.py -n 80 --epochs 3
Last line (machine-readable; seconds):
    handover_median_s=<m> handover_p95_s=<p> handovers=<count>
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from _common import bench_env, fmt, median, run_search, scratch_folder, write_yaml
from sqlalchemy import select

from storage import TrialRun, WarmJob, session_scope

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"
PHASES = (
    "hand back seen by the driver",
    "driver: tell, ask, place, spec",
    "rank 0 takes the spec",
    "ranks' set-up to first batch",
)
RANK_0_PHASES = (
    "rank 0: hand back and start",
    "ranks' set-up to first batch",
)


@dataclass(frozen=True)
class HandOver:
    """One trial handed to a warm job's waiting ranks: the moments that bound its phases."""

    last_record: dt.datetime  # the previous run's last record
    seen: dt.datetime  # the driver recorded the previous run's hand back
    spec_written: dt.datetime  # the next run's row (and the job's spec) written
    ranks_started: dt.datetime  # rank 0 took the spec and passed the fence
    first_batch: dt.datetime  # the next run's first batch

    @property
    def by_rank_0(self) -> bool:
        """Whether rank 0 started the trial itself (decided ahead), before the driver looked."""
        return self.spec_written < self.seen

    @property
    def total_s(self) -> float:
        return (self.first_batch - self.last_record).total_seconds()

    def phases_s(self) -> tuple[float, ...]:
        """Seconds of each phase: :data:`RANK_0_PHASES` or :data:`PHASES`, by its kind."""
        moments = (
            (self.last_record, self.ranks_started, self.first_batch)
            if self.by_rank_0
            else (
                self.last_record,
                self.seen,
                self.spec_written,
                self.ranks_started,
                self.first_batch,
            )
        )
        return tuple((b - a).total_seconds() for a, b in itertools.pairwise(moments))


def search_config(*, max_trials: int, epochs: int, folder: Path) -> dict[str, Any]:
    """The digits example on two warm 1-slot jobs, ``max_trials`` trials of up to ``epochs``."""
    example = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    searcher = {
        **example["searcher"],
        "max_trials": max_trials,
        "max_length": {"epochs": epochs},
        "max_concurrent_trials": 2,
    }
    return {
        **example,
        "name": "digits-handover",
        "searcher": searcher,
        "resources": {"slots_per_trial": 1, "reuse_workers": True},
        "checkpoint_storage": {
            **example.get("checkpoint_storage", {}),
            "path": str(folder / "checkpoints"),
        },
    }


def read_handovers(db_url: str) -> list[HandOver]:
    """Every hand-over of the database's warm jobs whose moments were all recorded."""
    with session_scope(db_url) as session:
        tokens = set(session.scalars(select(WarmJob.launch_token)))
        runs = session.execute(
            select(
                TrialRun.launch_token,
                TrialRun.started_at,
                TrialRun.ended_at,
                TrialRun.progress_at,
                TrialRun.ranks_started_at,
                TrialRun.training_started_at,
            )
            .where(TrialRun.launch_token.in_(tokens))
            .order_by(TrialRun.id)
        ).all()
    by_job: dict[str, list[Any]] = {}
    for run in runs:
        by_job.setdefault(run.launch_token, []).append(run)
    handovers = []
    for job_runs in by_job.values():
        for before, after in itertools.pairwise(job_runs):
            moments = (
                before.progress_at,
                before.ended_at,
                after.started_at,
                after.ranks_started_at,
                after.training_started_at,
            )
            if any(moment is None for moment in moments):
                continue
            handovers.append(HandOver(*moments))
    return handovers


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated between the nearest ranks."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def report(handovers: Sequence[HandOver]) -> str:
    """The summary's lines, the machine-readable one last."""
    if not handovers:
        raise SystemExit("no hand-over was recorded (did every trial run on a new job?)")
    by_rank_0 = [h for h in handovers if h.by_rank_0]
    by_driver = [h for h in handovers if not h.by_rank_0]
    lines = [
        f"{len(handovers)} hand-overs on warm jobs: {len(by_rank_0)} started by rank 0 "
        f"(decided ahead), {len(by_driver)} by the driver",
        f"{'phase':34s} {'median':>8s} {'p95':>8s}",
    ]
    groups = (
        ("started by rank 0", by_rank_0, RANK_0_PHASES),
        ("handed over by the driver", by_driver, PHASES),
    )
    for title, group, names in groups:
        if group:
            lines.append(f"{title} ({len(group)})")
        for index, name in enumerate(names if group else ()):
            values = [h.phases_s()[index] for h in group]
            lines.append(
                f"  {name:32s} {fmt(median(values)):>8s} {fmt(percentile(values, 0.95)):>8s}"
            )
    totals = [h.total_s for h in handovers]
    lines.append(
        f"{'last record -> first batch':34s} {fmt(median(totals)):>8s} "
        f"{fmt(percentile(totals, 0.95)):>8s}"
    )
    lines.append(
        f"handover_median_s={fmt(median(totals))} handover_p95_s={fmt(percentile(totals, 0.95))} "
        f"handovers={len(handovers)}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="trials of the search (40)")
    parser.add_argument("--epochs", type=int, default=2, help="max_length in epochs (2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--from", dest="from_db", type=Path, help="measure a kept search.db")
    args = parser.parse_args(argv)
    if args.from_db is not None:
        print(report(read_handovers(f"sqlite:///{args.from_db.resolve()}")))
        return
    with scratch_folder("handover-", keep=args.keep) as folder:
        shutil.copy(EXAMPLE / "model.py", folder / "model.py")
        config = write_yaml(
            folder / "experiment.yaml",
            search_config(max_trials=args.n, epochs=args.epochs, folder=folder),
        )
        db = folder / "search.db"
        search = run_search(config, db_path=db, cwd=folder, env=bench_env(folder), slots=2)
        print(f"search of {args.n} trials took {fmt(search.wall_s, 1)} s")
        print(report(read_handovers(search.db_url)))


if __name__ == "__main__":
    main()
