"""Latency of the cluster-wide placement decision on a real database with a huge queue.

``bench/scheduler_sim.py --experiments N`` measures the scheduler core alone; this
measures what a driver pays per tick: :func:`trials.coordination.cluster_queue.decide` in one
transaction of a real SQLite file (the queue lock, dropping dead drivers' rows,
reclaiming leases, reading the queue and the slot ledger, the decision, claims, reasons).

Seeds ``--experiments`` live experiments with ``--queued`` queued trials in all, on a
pool of ``--agents`` agents of 8 slots, all but a few held by running trials; then
times ``--decisions`` decisions, alternating the deciding experiment, each after one
running trial ended (so each decision has a freed slot to consider). The baseline, in the same
run, is one transaction that only reads the queue rows (what any database-backed
decision must at least do).

Last line: ``decision_p50_ms=<a> decision_p99_ms=<b> read_p50_ms=<c> ratio=<b/c> queue=<q>``.

Usage: ``.venv/bin/python bench/queue_decision.py [--queued 10000] [--decisions 60]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from storage import (
    Experiment,
    ExperimentState,
    QueuedTrial,
    Trial,
    TrialRun,
    TrialState,
    session_scope,
    upgrade_schema,
    utcnow,
)
from trials.coordination import allocations, cluster_queue
from trials.scheduler import Agent, AgentSlots, Placement, ResourcePool


def _seed(url: str, pool: ResourcePool, experiments: int, queued: int) -> list[int]:
    """Live experiments, one running 1-slot trial per slot but a few, and the queue."""
    slots = [(agent, slot) for agent in pool.agents for slot in agent.slots]
    running = len(slots) - 3
    with session_scope(url) as session:
        ids = []
        for i in range(experiments):
            experiment = Experiment(
                name=f"e{i}",
                study_name=f"bench-{i}",
                state=ExperimentState.ACTIVE,
                config={"resources": {"priority": 42}},
                model_dir=".",
                max_trials=0,
                driver_heartbeat_at=utcnow(),
            )
            session.add(experiment)
            session.flush()
            ids.append(experiment.id)
        total = running + queued
        trials = [
            Trial(
                experiment_id=ids[n % experiments],
                optuna_trial_id=n,
                optuna_trial_number=n,
                state=TrialState.RUNNING if n < running else TrialState.QUEUED,
                hparams={},
                slots_per_trial=1 if n < running else (1, 1, 2, 4, 8)[n % 5],
            )
            for n in range(total)
        ]
        session.add_all(trials)
        session.flush()
        for n, trial in enumerate(trials[:running]):
            agent, slot = slots[n]
            allocations.claim(
                session,
                Placement(trial.id, pool.name, (AgentSlots(agent, (slot,)),)),
                trial_id=trial.id,
                experiment_id=trial.experiment_id,
                lease_s=3600,
            )
            session.add(TrialRun(trial_id=trial.id, attempt=0, agents=[]))
        cluster_queue.enqueue(
            session,
            [
                cluster_queue.QueueEntry(
                    trial_id=trial.id,
                    experiment_id=trial.experiment_id,
                    pool=pool.name,
                    slots=trial.slots_per_trial,
                    priority=(1, 42, 42, 42)[n % 4],
                    weight=float(1 + n % 2),
                )
                for n, trial in enumerate(trials[running:])
            ],
        )
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--experiments", type=int, default=8)
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=60)
    args = parser.parse_args(argv)
    pool = ResourcePool(
        "default", tuple(Agent(f"a{i}", "127.0.0.1", tuple(range(8))) for i in range(args.agents))
    )
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'queue.db'}"
        upgrade_schema(url)
        experiments = _seed(url, pool, args.experiments, args.queued)
        decisions: list[float] = []
        reads: list[float] = []
        for n in range(args.decisions):
            with session_scope(url) as session:
                # One running trial ends: the decision has a freed slot to consider.
                held = session.scalars(
                    select(TrialRun.trial_id).where(TrialRun.ended_at.is_(None)).limit(1)
                ).first()
                if held is not None:
                    allocations.release(session, held)
                    run = session.scalars(select(TrialRun).where(TrialRun.trial_id == held)).one()
                    run.ended_at = utcnow()
            began = time.perf_counter()
            with session_scope(url) as session:
                placed = cluster_queue.decide(
                    session,
                    pool,
                    experiment_id=experiments[n % len(experiments)],
                    lease_s=3600,
                    processes_gone=lambda trial_id: False,
                )
            decisions.append((time.perf_counter() - began) * 1000)
            # The placed trials "start": their claims stay, their rows are gone.
            with session_scope(url) as session:
                for trial_id, _ in placed:
                    session.add(TrialRun(trial_id=trial_id, attempt=0, agents=[]))
            began = time.perf_counter()
            with session_scope(url) as session:
                session.execute(
                    select(QueuedTrial.trial_id, QueuedTrial.slots, QueuedTrial.priority)
                ).all()
            reads.append((time.perf_counter() - began) * 1000)
        with session_scope(url) as session:
            left = len(session.scalars(select(QueuedTrial.trial_id)).all())
    decisions.sort()
    p50 = statistics.median(decisions)
    p99 = decisions[min(len(decisions) - 1, int(0.99 * len(decisions)))]
    read = statistics.median(reads)
    print(f"decisions={len(decisions)} agents={args.agents} experiments={args.experiments}")
    print(
        f"decision_p50_ms={p50:.2f} decision_p99_ms={p99:.2f} read_p50_ms={read:.2f} "
        f"ratio={p99 / read:.2f} queue={left}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
