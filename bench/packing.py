"""Packing small trials onto one slot: whole-slot trials against 1/4 shares of it.

The same search (the digits example's space, random search with one seed, so both arms
run the same trials in the same order) runs twice on ONE slot (``--slots 1``):

- ``whole``: ``resources.slots_per_trial: 1``: one trial at a time, today's placement;
- ``shares``: ``resources.slots_per_trial: 0.25`` (``--share``): four trials at once on
  the slot, each capped at a quarter of its GPU's memory.

Both allow ``--concurrent`` trials at once (default 4) and keep warm workers as the
example does, so only the placement differs. Printed for each: wall time, trials per hour,
the best ``val_loss`` and when the search first reached it (seconds from its start to the
end of the trial that found it), then the ratios shares / whole (trials per hour) and
whole / shares (time to the best value; the same trial is best in both arms, as both
run the same trials). The last line::

    trials_per_hour_ratio=<x> time_to_best_ratio=<y> trials=<n> share=<s> device=<cpu|cuda>

Run: ``.venv/bin/python bench/packing.py`` (16 trials; about 6 minutes on this
repository's 2-core CPU machine). Without a GPU a slot is one CPU process: four
processes on one "slot" share the machine's cores, so the ratio says how much of the
CPU one small trial leaves idle, not what a GPU would give. On a machine with NVIDIA
GPUs the slot is GPU 0 (NVML) and the target is at least 3x the trials per hour with
1/4 shares; the GPU figure is still to be taken (README, Benchmarks).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from _common import bench_env, epoch_s, fmt, run_search, scratch_folder, write_yaml
from sqlalchemy import select

from storage import Trial, TrialState, session_scope

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"


def packing_config(share: float, *, trials: int, concurrent: int, epochs: int, seed: int) -> dict:
    """The search of one arm: the example's space, random search, ``share`` of a slot each."""
    config = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    config["name"] = f"packing-{share:g}"
    config["searcher"].update(
        name="random",
        pruner={"name": "none"},
        max_trials=trials,
        max_concurrent_trials=concurrent,
        max_length={"epochs": epochs},
        seed=seed,
    )
    config["resources"] = {**config.get("resources", {}), "slots_per_trial": share}
    return config


@dataclass(frozen=True)
class Arm:
    """What one arm's search did."""

    name: str
    trials: int
    wall_s: float
    best: float
    best_at_s: float
    completed: int

    @property
    def per_hour(self) -> float:
        return self.trials / (self.wall_s / 3600)


def run_arm(root: Path, name: str, share: float, args: argparse.Namespace) -> Arm:
    folder = root / name
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLE / "model.py", folder / "model.py")
    config = packing_config(
        share, trials=args.trials, concurrent=args.concurrent, epochs=args.epochs, seed=args.seed
    )
    path = write_yaml(folder / "experiment.yaml", config)
    run = run_search(
        path, db_path=folder / "search.db", cwd=folder, env=bench_env(folder), slots=1
    )
    with session_scope(run.db_url) as session:
        rows = session.execute(
            select(Trial.state, Trial.searcher_metric_value, Trial.ended_at)
        ).all()
    done = [(value, ended) for state, value, ended in rows if state == TrialState.COMPLETED]
    if not done:
        raise RuntimeError(f"{name}: no trial completed:\n{run.output[-3000:]}")
    best, ended = min(done, key=lambda item: (item[0], item[1]))
    return Arm(
        name=name,
        trials=len(rows),
        wall_s=run.wall_s,
        best=best,
        best_at_s=epoch_s(ended) - run.started,
        completed=len(done),
    )


def report(whole: Arm, shares: Arm, *, share: float, device: str) -> list[str]:
    """The lines the benchmark prints (pure: tested on hand-made arms)."""
    lines = [
        f"{arm.name:>6}: {arm.trials} trials ({arm.completed} completed) in {fmt(arm.wall_s, 1)} s, "
        f"{fmt(arm.per_hour, 0)} trials/h; best val_loss {arm.best:.4g} reached after "
        f"{fmt(arm.best_at_s, 1)} s"
        for arm in (whole, shares)
    ]
    per_hour = shares.per_hour / whole.per_hour
    to_best = whole.best_at_s / shares.best_at_s
    lines.append(
        f"shares of {share:g} on one slot: {per_hour:.2f}x the trials per hour, "
        f"the best value {to_best:.2f}x as soon"
    )
    lines.append(
        f"trials_per_hour_ratio={per_hour:.3f} time_to_best_ratio={to_best:.3f} "
        f"trials={whole.trials} share={share:g} device={device}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16, help="trials per arm")
    parser.add_argument("--concurrent", type=int, default=4, help="max_concurrent_trials")
    parser.add_argument("--epochs", type=int, default=3, help="max_length in epochs")
    parser.add_argument("--share", type=float, default=0.25, help="the shares arm's share")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    from trials._system_metrics import detect_gpus

    device = "cuda" if detect_gpus() else "cpu"
    print(
        f"packing: {args.trials} digits trials per arm on one {device} slot, "
        f"{args.concurrent} at once at most, {args.epochs} epochs, seed {args.seed}"
    )
    with scratch_folder("slotsweep-packing-", keep=args.keep) as root:
        whole = run_arm(root, "whole", 1, args)
        shares = run_arm(root, "shares", args.share, args)
    for line in report(whole, shares, share=args.share, device=device):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
