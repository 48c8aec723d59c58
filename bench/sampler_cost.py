"""What the system-metrics sampler costs: CPU time of one core, against an idle baseline.

One process, one SQLite database in a temporary folder, a trial row to record under.
The sampler's imports and first write are paid once before measuring (a trial's rank
has them already). Then, ``--rounds`` times in turn, the process's CPU time over
``--seconds`` with the main thread asleep (the baseline: the interpreter's own
threads) and over the same time with :class:`~trials._system_metrics.SystemMetricsSampler`
sampling every ``--interval-s`` (default: ``profiling.system_metrics_interval_s``'s
default) and writing each sample to the database, fenced like a trial's. The cost is
the difference of the medians, as a percentage of one core.

Run:
    .venv/bin/python bench/sampler_cost.py [--seconds 30] [--rounds 3] [--interval-s 5]
Last line (machine-readable):
    sampler_cpu_percent=<x> idle_cpu_percent=<y> interval_s=<s> samples=<n>
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage import (
    Experiment,
    ExperimentState,
    SystemMetric,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
    upgrade_schema,
)
from trials import ProfilingConfig
from trials._system_metrics import SystemMetricsSampler


def _trial(db_url: str) -> int:
    """An experiment, a running trial and its attempt 0: what a sampler records under."""
    with session_scope(db_url) as session:
        experiment = Experiment(
            name="bench",
            study_name="bench",
            state=ExperimentState.ACTIVE,
            config={},
            model_dir=".",
            max_trials=1,
        )
        session.add(experiment)
        session.flush()
        trial = Trial(
            experiment_id=experiment.id,
            optuna_trial_id=0,
            optuna_trial_number=0,
            state=TrialState.RUNNING,
            hparams={},
            slots_per_trial=1,
        )
        session.add(trial)
        session.flush()
        session.add(TrialRun(trial_id=trial.id, attempt=0))
        return int(trial.id)


def _cpu_over(seconds: float, sampler: SystemMetricsSampler | None) -> float:
    """Percent of one core this process used over ``seconds`` (sampler running if given)."""
    start_cpu, start = time.process_time(), time.monotonic()
    if sampler is not None:
        sampler.start()
    time.sleep(seconds)
    if sampler is not None:
        sampler.stop()
    return 100.0 * (time.process_time() - start_cpu) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--interval-s", type=float, default=ProfilingConfig().system_metrics_interval_s
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slotsweep-sampler-cost-") as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_schema(db_url)
        trial_id = _trial(db_url)

        def sampler(interval_s: float) -> SystemMetricsSampler:
            return SystemMetricsSampler(
                db_url, trial_id=trial_id, agent="bench", interval_s=interval_s, attempt=0
            )

        # Imports, the engine, psutil's first calls: paid once, as in a running trial.
        _cpu_over(0.3, sampler(0.1))
        idle, busy = [], []
        for round_index in range(args.rounds):
            idle.append(_cpu_over(args.seconds, None))
            busy.append(_cpu_over(args.seconds, sampler(args.interval_s)))
            print(
                f"round {round_index + 1}: idle {idle[-1]:.3f} %, with sampler {busy[-1]:.3f} % "
                "of one core",
                flush=True,
            )
        with session_scope(db_url) as session:
            samples = len(
                {row.recorded_at for row in session.query(SystemMetric).filter_by(agent="bench")}
            )
    cost = max(0.0, statistics.median(busy) - statistics.median(idle))
    print(
        f"sampler_cpu_percent={cost:.4f} idle_cpu_percent={statistics.median(idle):.4f} "
        f"interval_s={args.interval_s:g} samples={samples}"
    )


if __name__ == "__main__":
    main()
