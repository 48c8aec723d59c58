"""Bookkeeping overhead of many short trials: slotsweep against Ray Tune, and at 10,000 trials.

N trials that each only sleep T seconds (defaults N=500, T=1), two at a time, run two
ways in one invocation:

- slotsweep: one ``slotsweep run`` search on ``--slots 2`` of 1-slot trials with warm
  workers (``resources.reuse_workers: true``, ``max_concurrent_trials: 2``, random
  sampler, no pruner), so two torchrun jobs start once and run every trial; each trial
  is a core-API function that sleeps T s and reports ``val_loss``.
- Ray Tune: the same N trials as function trainables of 1 CPU each on a 2-CPU
  ``ray.init`` (``tune.Tuner``, random search over the same one-value space), each
  sleeping T s and reporting once.

The minimum is N*T/2 (two trials at a time, nothing else). Observed is each search's
wall time: the ``slotsweep run`` process from its start to its exit (the CLI's imports
and the two jobs' start-up included), and ``Tuner.fit`` from its call to its return
(``ray.init`` before it is not counted: it stands for a running cluster). Each also gets
the span from its first trial's start to its last trial's end (slotsweep: the database;
Ray: the trials' own clocks), which leaves the one-time start-up out.

``--study-size S`` measures instead the driver's per-trial cost (Optuna's ask and tell,
the trial's row and outcome, the placement decision and its slot claim: what the
driver does for a trial besides running it, in-process, no processes started) on the
digits example's space and TPE sampler, first with 100 finished trials in the study,
then with S. The study is filled quickly: random trials drawn in memory, added to the
experiment's Optuna study (``Study.add_trials``) and given their finished rows in one
transaction. Each cost is also given without the sampler's share (Optuna's ask, the
sampler's joint draw and the suggestions: where TPE samples): what grows with the
study inside TPE itself is Optuna's, the rest is the driver's own.

On a loaded machine the wall times move with the load: run with smaller N (``-n``) and
say so.

Run:
    .venv/bin/python bench/bookkeeping.py                  # N=500, T=1: about 5 minutes per side
    .venv/bin/python bench/bookkeeping.py -n 60 -t 0.5
    .venv/bin/python bench/bookkeeping.py --study-size 10000
Last line (machine-readable):
    slotsweep_ratio=<observed/minimum> ray_tune_ratio=<observed/minimum>
    per_trial_s_at_100=<a> per_trial_s_at_<S>=<b> growth=<b/a> growth_without_sampler=<c>
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from _common import bench_env, epoch_s, fmt, run_search, scratch_folder, write_yaml
from sqlalchemy import func, select

from storage import Trial, TrialRun, TrialState, optuna_trial_id, session_scope

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"
SLEEP_TRIAL = '''"""A trial that only sleeps ``sleep_s`` seconds, then reports ``val_loss``."""

import time


def main(context):
    time.sleep(float(context.hparams["sleep_s"]))
    context.report_validation_metrics(1, {"val_loss": float(context.hparams["x"])})
'''
# Trials the driver's per-trial cost is averaged over, at each study size.
COST_TRIALS = 30


def sleep_config(n: int, sleep_s: float) -> dict[str, Any]:
    """The slotsweep search of ``n`` sleeping trials, two warm 1-slot jobs at a time."""
    return {
        "name": "bookkeeping",
        "entrypoint": "sleep_trial:main",
        "hyperparameters": {
            "x": {"type": "double", "minval": 0.0, "maxval": 1.0},
            "sleep_s": sleep_s,
            "global_batch_size": 1,
        },
        "searcher": {
            "name": "random",
            "pruner": {"name": "none"},
            "metric": "val_loss",
            "max_trials": n,
            "max_length": {"batches": 1},
            "max_concurrent_trials": 2,
            "seed": 0,
        },
        "resources": {"slots_per_trial": 1, "reuse_workers": True},
        "max_restarts": 0,
    }


def run_slotsweep(n: int, sleep_s: float, folder: Path) -> tuple[float, float]:
    """The search's wall time and its trials' span (first start to last end), in seconds."""
    folder.mkdir(parents=True)
    (folder / "sleep_trial.py").write_text(SLEEP_TRIAL)
    config = write_yaml(folder / "experiment.yaml", sleep_config(n, sleep_s))
    search = run_search(
        config,
        db_path=folder / "search.db",
        cwd=folder,
        env=bench_env(folder),
        slots=2,
        timeout_s=max(1800.0, 20 * n * sleep_s),
    )
    with session_scope(search.db_url) as session:
        completed = session.scalar(select(func.count()).where(Trial.state == TrialState.COMPLETED))
        first, last = session.execute(
            select(func.min(TrialRun.started_at), func.max(TrialRun.ended_at))
        ).one()
    if completed != n:
        raise SystemExit(f"slotsweep: {completed} of {n} trials completed")
    return search.wall_s, epoch_s(last) - epoch_s(first)


def run_ray_tune(n: int, sleep_s: float, folder: Path) -> tuple[float, float]:
    """``Tuner.fit``'s wall time and its trials' span (first start to last end), in seconds."""
    import ray
    from ray import tune

    def trainable(config: dict[str, Any]) -> None:
        started = time.time()
        time.sleep(sleep_s)
        tune.report({"val_loss": config["x"], "started": started, "ended": time.time()})

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"x": tune.uniform(0.0, 1.0)},
            tune_config=tune.TuneConfig(num_samples=n, metric="val_loss", mode="min"),
            run_config=tune.RunConfig(storage_path=str(folder), name="bookkeeping", verbose=0),
        )
        began = time.time()
        results = tuner.fit()
        wall = time.time() - began
    finally:
        ray.shutdown()
    frame = results.get_dataframe()
    if len(frame) != n or results.errors:
        raise SystemExit(f"ray tune: {len(frame)} of {n} trials reported, {results.errors}")
    return wall, float(frame["ended"].max() - frame["started"].min())


# ------------------------------------------------------------------ study size
def _cost_config(max_trials: int) -> Any:
    from trials.config import parse_config

    raw = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    raw["searcher"].update(max_trials=max_trials, max_concurrent_trials=1)
    raw["resources"] = {"slots_per_trial": 1}
    return parse_config(raw)


def _filled_driver(folder: Path, finished: int) -> tuple[Any, Any, Any, Any]:
    """A driver's parts on a new experiment whose study holds ``finished`` finished trials."""
    import optuna

    import searcher.submit.space as space
    from searcher.driver.context import DriverContext
    from searcher.driver.control import Control, claim_ownership
    from searcher.driver.outcomes import Outcomes
    from searcher.driver.placement import PendingQueue
    from searcher.driver.study_side import StudySide, TellQueue
    from searcher.submit.creation import create_experiment
    from storage import Experiment, session_scope, upgrade_schema
    from trials.executors import LocalExecutor
    from trials.scheduler import Agent, ResourcePool
    from trials.timings import Timings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder.mkdir(parents=True)
    url = f"sqlite:///{folder / 'study.db'}"
    upgrade_schema(url)
    config = _cost_config(finished + COST_TRIALS + 1)
    experiment_id = create_experiment(
        config, config_path=None, db_url=url, directions=["minimize"], model_dir=EXAMPLE
    )
    with session_scope(url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        checkpoint_folder = experiment.checkpoint_folder
    ctx = DriverContext(
        db_url=url,
        experiment_id=experiment_id,
        study_name=f"{config.name}-{experiment_id}",
        model_dir=EXAMPLE,
        config=config,
        pool=ResourcePool("default", (Agent("local", "127.0.0.1", (0,)),)),
        executor=LocalExecutor(use_gpus=False),
        run_dir=folder / "logs",
        timings=Timings(),
        checkpoint_folder=checkpoint_folder,
    )
    # Random finished trials of the example's space, drawn in memory, then stored.
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    rng = random.Random(0)
    for _ in range(finished):
        asked = scratch.ask()
        space.suggest_hparams(asked, config.hyperparameters)
        scratch.tell(asked, rng.random())
    tells = TellQueue()
    study = StudySide.load(ctx, trials_so_far=finished, tells=tells)
    study.study.add_trials(scratch.trials)
    stored = sorted(study.study.get_trials(deepcopy=False), key=lambda t: t.number)
    with session_scope(url) as session:
        for frozen in stored:
            trial_id = optuna_trial_id(url, study.study.study_name, frozen.number)
            trial = study.new_trial_row(frozen.number, trial_id, frozen.params)
            trial.state = TrialState.COMPLETED
            trial.searcher_metric_value = frozen.value
            session.add(trial)
    # Owned once filled: a decision drops the queue of a driver whose heartbeat is stale.
    claim_ownership(ctx)
    return ctx, study, PendingQueue(ctx), Outcomes(ctx, tells, Control())


@contextlib.contextmanager
def sampler_clock(study: Any) -> Iterator[list[float]]:
    """Seconds the study's sampler spends meanwhile: Optuna's ask, its joint draw and the
    suggestions.

    TPE draws a trial's values jointly when the trial's ``relative_params`` are first
    read (the driver reads them right after the ask, before the suggestions store them),
    so all three are timed, each only where no other timed call is under way (a
    suggestion reads them too); the rest of a trial's cost is the driver's own (rows,
    placement, outcome, tell).
    """
    import optuna

    import searcher.submit.space as space

    spent = [0.0]
    depth = [0]

    def timed(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[0] += time.perf_counter() - began

        return call

    suggest = space.suggest_hparams
    trial_class: Any = optuna.trial.Trial
    relative_params = trial_class.__dict__["relative_params"]  # the property itself
    # Set on the instance, it shadows the class's method until deleted.
    study.study.ask = timed(study.study.ask)
    space.suggest_hparams = timed(suggest)
    trial_class.relative_params = property(timed(relative_params.fget))
    try:
        yield spent
    finally:
        delattr(study.study, "ask")
        space.suggest_hparams = suggest
        trial_class.relative_params = relative_params


def one_trial_cost(parts: tuple[Any, Any, Any, Any], rng: random.Random) -> tuple[float, float]:
    """Seconds the driver spends on one trial (ask, row, placement, outcome, tell) besides
    running it, and how many of them the sampler took (:func:`sampler_clock`)."""
    from datetime import timedelta

    from searcher.driver.control import Control, heartbeat
    from storage import utcnow
    from trials.coordination import allocations as slot_ledger

    ctx, study, pending, outcomes = parts
    # The driver's heartbeat runs every few seconds, not per trial: kept out of the cost.
    heartbeat(ctx, Control())
    began = time.perf_counter()
    with sampler_clock(study) as sampler:
        study.fill_queue(0, pending)
    (placed,) = pending.place(room=1)
    with session_scope(ctx.db_url) as session:
        trial = session.get(Trial, placed.trial_id)
        assert trial is not None
        now = utcnow()
        # What rank 0 would have recorded: the trial ran and finished.
        trial.state = TrialState.RUNNING
        trial.started_at = now - timedelta(seconds=1)
        trial.finished_at = now
        trial.searcher_metric_value = rng.random()
        outcomes.finalize(session, trial, exit_code=0)
        slot_ledger.release(session, trial.id)
    study.flush_tells()
    return time.perf_counter() - began, sampler[0]


def study_size_report(size: int, root: Path) -> None:
    """The driver's per-trial cost at 100 and at ``size`` finished trials, and its growth.

    Both studies are filled first; then their trials alternate (one at 100, one at
    ``size``, ...), so that a machine's changing load weighs on both alike.
    """
    sizes = (100, size)
    parts = {}
    for finished in sizes:
        began = time.time()
        parts[finished] = _filled_driver(root / f"study-{finished}", finished)
        print(f"filled a study with {finished} trials in {fmt(time.time() - began, 1)} s")
    costs: dict[int, list[float]] = {finished: [] for finished in sizes}
    # The same trials' cost without the sampler's share: the driver's own.
    own: dict[int, list[float]] = {finished: [] for finished in sizes}
    rng = random.Random(1)
    for _ in range(COST_TRIALS):
        for finished in sizes:
            total, sampler = one_trial_cost(parts[finished], rng)
            costs[finished].append(total)
            own[finished].append(total - sampler)
    for finished in sizes:
        values = costs[finished]
        print(
            f"{finished} finished trials: per trial median {fmt(statistics.median(values))} s, "
            f"mean {fmt(statistics.fmean(values))} s, max {fmt(max(values))} s "
            f"over {COST_TRIALS} trials; without the sampler's ask, draw and suggestions "
            f"median {fmt(statistics.median(own[finished]))} s"
        )
    at_100, at_size = (statistics.median(costs[finished]) for finished in sizes)
    own_100, own_size = (statistics.median(own[finished]) for finished in sizes)
    print(
        f"per_trial_s_at_100={fmt(at_100)} per_trial_s_at_{size}={fmt(at_size)} "
        f"growth={fmt(at_size / at_100, 2)} growth_without_sampler={fmt(own_size / own_100, 2)}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="trials per side (500)")
    parser.add_argument("-t", type=float, default=1.0, help="seconds each trial sleeps (1)")
    parser.add_argument(
        "--study-size",
        type=int,
        default=None,
        help="measure the driver's per-trial cost at 100 and at this many finished trials",
    )
    parser.add_argument(
        "--only", choices=("slotsweep", "ray"), help="run one side only (no ratio line)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    if args.n < 1 or args.t <= 0:
        parser.error("-n must be positive and -t above 0")
    with scratch_folder("bookkeeping-", keep=args.keep) as root:
        if args.study_size is not None:
            if args.study_size < 100:
                parser.error("--study-size must be at least 100")
            study_size_report(args.study_size, root)
            return
        minimum = args.n * args.t / 2
        ratios = {}
        for side, run in (("slotsweep", run_slotsweep), ("ray", run_ray_tune)):
            if args.only not in (None, side):
                continue
            wall, span = run(args.n, args.t, root / side)
            ratios[side] = wall / minimum
            print(
                f"{side:9s}: {args.n} trials of {args.t:g} s on 2 slots in {fmt(wall, 1)} s "
                f"(minimum {fmt(minimum, 1)} s): ratio {fmt(wall / minimum)}; "
                f"first start to last end {fmt(span, 1)} s: ratio {fmt(span / minimum)}",
                flush=True,
            )
        if args.only is None:
            print(
                f"slotsweep_ratio={fmt(ratios['slotsweep'])} ray_tune_ratio={fmt(ratios['ray'])}"
            )


if __name__ == "__main__":
    main()
