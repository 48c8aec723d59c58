"""Compute that random search and TPE with ASHA pruning need to first reach a target.

Both arms search the digits example's space (``examples/digits/experiment.yaml``: its
``hyperparameters`` section is read from that file and used verbatim, with the
example's ``model.py`` copied beside the generated config) as real ``slotsweep run``
searches, one SQLite database per search:

- (a) ``searcher.name: random``, ``pruner: none``;
- (b) ``searcher.name: tpe`` (the driver's multivariate TPE, ``constant_liar`` on since
  two trials run at once) with ``pruner: {name: asha, min_resource: 1,
  reduction_factor: 3}``, the example's pruner.

Everything else is the same for both arms and every seed (``--seeds``, default 0 1 2,
used as ``searcher.seed``): ``max_length: {epochs: 9}`` (ASHA's rungs at 1 and 3 epochs
and a full trial at 3 x 3 = 9, the geometry reduction factor 3 is made for; with the
example's 6 the last rung would be only twice the one before), ``metric: val_accuracy``
(larger is better, so both searchers optimise the quantity the target is about),
``max_trials: 40`` (a cap, not a budget: the figure stops at the first hit; random
search needed at most 30 trials in our runs), ``slots_per_trial: 1``,
``max_concurrent_trials: 2`` on ``--slots 2`` (the machine's two cores), validation
every epoch, and the example's checkpoint period, optimizations and ``max_restarts``.
TPE's ``n_startup_trials`` is the driver's default (10) unless ``--n-startup-trials``.

The default target, ``val_accuracy >= 0.97`` (``--target``), is near the top of what
this MLP reaches on the 359 validation digits (the best trials reach about 0.98) and is
reached within 9 epochs by about one random configuration in ten, so random search
needs several trials and a searcher has room to do better.

Compute to first reach the target: the trials are
taken in the order they finished (``slotsweep_trials.ended_at``); a trial reaches the
target when any validation it reported reaches it; the compute is the sum, over the
trials up to and including the first one that reached it, of the epochs each actually
trained (a pruned trial counts only the epochs before it was stopped), and the same
sum of ``slotsweep_trials.slot_seconds``. A search that never reaches the target
counts everything it spent (and is flagged). The medians over seeds are compared.

With two trials at once the finishing order, and so the figure, can vary a little from
run to run for the same seed. Slot-seconds include each trial's start-up (several
seconds per trial here, more than an epoch of this model), so pruning saves far less of
them than of epochs.

To keep the run short, a search is stopped (``slotsweep kill``) as soon as a finished
trial has reached the target: trials that finish later cannot change the figure.
``--full`` runs every search to ``max_trials`` instead. A default run takes about 5
minutes on an idle 2-core machine (15 or more when other work shares it).

Run:
    .venv/bin/python bench/search_efficiency.py                 # seeds 0 1 2, target 0.97
    .venv/bin/python bench/search_efficiency.py --seeds 0 1 2 3 4 --target 0.96
Last line (machine-readable; compute in trial-epochs):
    random_compute=<a> tpe_asha_compute=<b> ratio=<b/a>
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from _common import bench_env, epoch_s, fmt, median, run_search, slotsweep_argv, write_yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"
ARMS = ("random", "tpe_asha")


def search_config(
    arm: str,
    seed: int,
    *,
    max_trials: int,
    epochs: int,
    folder: Path,
    n_startup_trials: int | None = None,
) -> dict[str, Any]:
    """The example's experiment with the benchmark's searcher settings for ``arm``."""
    example = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    if arm == "random":
        searcher: dict[str, Any] = {"name": "random", "pruner": {"name": "none"}}
    else:
        searcher = {
            "name": "tpe",
            "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 3},
        }
        if n_startup_trials is not None:
            searcher["n_startup_trials"] = n_startup_trials
    searcher.update(
        metric="val_accuracy",
        smaller_is_better=False,
        max_trials=max_trials,
        max_length={"epochs": epochs},
        max_concurrent_trials=2,
        seed=seed,
    )
    return {
        **example,
        "name": f"digits-{arm}-seed{seed}",
        "searcher": searcher,
        "resources": {"slots_per_trial": 1},
        "checkpoint_storage": {
            **example.get("checkpoint_storage", {}),
            "path": str(folder / "checkpoints"),
        },
    }


@dataclass(frozen=True)
class TrialOutcome:
    trial_id: int
    state: str
    ended: float  # ordering key: when the driver recorded the trial's end
    epochs: float
    slot_seconds: float
    best_accuracy: float | None


@dataclass(frozen=True)
class SearchResult:
    arm: str
    seed: int
    reached: bool
    epochs: float
    slot_seconds: float
    trials_counted: int
    trials_total: int
    first_hit_accuracy: float | None
    wall_s: float


def trial_outcomes(db_url: str) -> list[TrialOutcome]:
    """Finished trials in the order they finished, with epochs trained and best accuracy."""
    from sqlalchemy import func, select

    from storage import Metric, MetricKind, Trial, session_scope

    with session_scope(db_url) as session:
        rows = session.execute(
            select(
                Trial.id,
                Trial.state,
                Trial.ended_at,
                Trial.slot_seconds,
                func.max(Metric.epoch),
                func.max(Metric.value),
            )
            .outerjoin(
                Metric,
                (Metric.trial_id == Trial.id)
                & (Metric.kind == MetricKind.VALIDATION)
                & (Metric.name == "val_accuracy"),
            )
            .where(Trial.ended_at.is_not(None))
            .group_by(Trial.id)
            .order_by(Trial.ended_at, Trial.id)
        ).all()
    return [
        TrialOutcome(
            trial_id=row[0],
            state=row[1].value,
            ended=epoch_s(row[2]) if row[2] is not None else float("inf"),
            epochs=float(round(row[4] or 0.0, 6)),
            slot_seconds=float(row[3] or 0.0),
            best_accuracy=None if row[5] is None else float(row[5]),
        )
        for row in rows
    ]


def compute_to_target(
    outcomes: list[TrialOutcome], target: float
) -> tuple[bool, float, float, int, float | None]:
    """(reached, epochs, slot-seconds, trials counted, accuracy of the hit) in finish order."""
    epochs = slot_seconds = 0.0
    for i, outcome in enumerate(outcomes, start=1):
        epochs += outcome.epochs
        slot_seconds += outcome.slot_seconds
        if outcome.best_accuracy is not None and outcome.best_accuracy >= target - 1e-12:
            return True, epochs, slot_seconds, i, outcome.best_accuracy
    return False, epochs, slot_seconds, len(outcomes), None


def run_one(arm: str, seed: int, *, args: argparse.Namespace, root: Path) -> SearchResult:
    folder = root / f"{arm}-seed{seed}"
    folder.mkdir(parents=True)
    shutil.copy2(EXAMPLE / "model.py", folder / "model.py")
    config = write_yaml(
        folder / "experiment.yaml",
        search_config(
            arm,
            seed,
            max_trials=args.max_trials,
            epochs=args.epochs,
            folder=folder,
            n_startup_trials=args.n_startup_trials,
        ),
    )
    env = bench_env(folder)
    killed = False
    next_check = [0.0]

    def stop_when_reached(db_url: str) -> None:
        # A finished trial reached the target: what finishes later cannot change the
        # figure, so stop the search (the driver records the killed trials as failed).
        nonlocal killed
        if args.full or killed or time.time() < next_check[0]:
            return
        if not (folder / "search.db").exists():
            return  # opening it here would create it under the driver's feet
        next_check[0] = time.time() + 2.0
        try:
            reached = compute_to_target(trial_outcomes(db_url), args.target)[0]
        except Exception:  # the schema is not there yet
            return
        if reached:
            subprocess.run(
                [*slotsweep_argv(), "kill", "1", "--db", db_url],
                cwd=folder,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                check=False,
            )
            killed = True

    search = run_search(
        config,
        db_path=folder / "search.db",
        cwd=folder,
        env=env,
        slots=2,
        poll_s=0.5,
        on_poll=stop_when_reached,
    )
    db_url, wall = search.db_url, search.wall_s
    outcomes = trial_outcomes(db_url)
    reached, epochs, slot_seconds, counted, hit = compute_to_target(outcomes, args.target)
    return SearchResult(
        arm, seed, reached, epochs, slot_seconds, counted, len(outcomes), hit, wall
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.97, help="val_accuracy to reach")
    parser.add_argument("--max-trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=9, help="searcher.max_length in epochs")
    parser.add_argument(
        "--n-startup-trials",
        type=int,
        default=None,
        help="TPE's random start-up trials (default: the driver's default, 10)",
    )
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--full", action="store_true", help="run every search to max_trials")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="search-efficiency-"))
    print(
        f"target val_accuracy >= {args.target}; max_length {args.epochs} epochs; "
        f"max_trials {args.max_trials}; seeds {args.seeds}; 1 slot per trial, 2 at once; "
        f"TPE n_startup_trials {args.n_startup_trials or 'default (10)'}",
        flush=True,
    )
    results: dict[str, list[SearchResult]] = {arm: [] for arm in args.arms}
    try:
        for seed in args.seeds:
            # Alternate which arm goes first, so load from other work on the machine
            # does not fall on one arm only (it affects slot-seconds, not epochs).
            order = args.arms if seed % 2 == 0 else list(reversed(args.arms))
            for arm in order:
                result = run_one(arm, seed, args=args, root=root)
                results[arm].append(result)
                status = (
                    f"reached {fmt(result.first_hit_accuracy or 0.0, 4)}"
                    if result.reached
                    else "NOT reached (all compute counted)"
                )
                print(
                    f"seed {seed} {arm:8s}: {status} after {result.trials_counted} trials "
                    f"({result.trials_total} finished), {fmt(result.epochs, 1)} trial-epochs, "
                    f"{fmt(result.slot_seconds, 1)} slot-s; search took {fmt(result.wall_s, 1)} s",
                    file=sys.stdout,
                    flush=True,
                )
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print()
    medians: dict[str, tuple[float, float]] = {}
    for arm, runs in results.items():
        medians[arm] = (median([r.epochs for r in runs]), median([r.slot_seconds for r in runs]))
        missed = [r.seed for r in runs if not r.reached]
        print(
            f"{arm:8s}: median {fmt(medians[arm][0], 1)} trial-epochs, "
            f"{fmt(medians[arm][1], 1)} slot-seconds"
            + (f"; seeds that never reached the target: {missed}" if missed else "")
        )
    if set(ARMS) <= set(medians):
        (a, a_s), (b, b_s) = medians["random"], medians["tpe_asha"]
        print(f"slot-seconds: random {fmt(a_s, 1)} tpe_asha {fmt(b_s, 1)} ratio {fmt(b_s / a_s)}")
        print(f"random_compute={fmt(a, 1)} tpe_asha_compute={fmt(b, 1)} ratio={fmt(b / a)}")


if __name__ == "__main__":
    main()
