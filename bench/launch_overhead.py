"""Per-trial launch overhead of slotsweep against bare ``torchrun``.

The same tiny 2-rank DDP job (``bench/launch_trial.py``: join gloo, wrap a small MLP in
DDP, 20 steps, average the final loss across ranks, leave the group) runs K times in
sequence two ways:

- bare: ``python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2
  --max-restarts=0 launch_trial.py`` (what the ``torchrun`` script runs), one after
  the other from this process, with the same environment the launcher gives trials
  (``OMP_NUM_THREADS=1``, ``PYTHONUNBUFFERED=1``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``);
- slotsweep: ONE ``slotsweep run`` search of K trials (``max_concurrent_trials: 1``,
  ``slots_per_trial: 2``, random sampler, no pruner, default profiling) whose
  entrypoint is the same file's core-API function ``launch_trial:slotsweep_main``. It
  reports the averaged loss as ``val_loss`` so every trial completes.

Both run in the same invocation, in ``--rounds`` rounds whose order alternates (bare
first, then slotsweep first, ...), after one untimed bare warm-up job; each round uses a
fresh temporary folder and SQLite database.

Per-trial cost:

- bare: the wall time of each ``torchrun`` (start to exit), averaged.
- slotsweep, headline: the search's span in the database, from the first trial's
  torchrun start (the process's start time, which rank 0 reads from /proc) to the last
  trial's reap (``trial_runs.ended_at`` of the last run), divided by K. This is the
  cadence of a search in steady state: it contains everything the platform adds per
  trial (the worker's set-up in the ranks, rank 0's recording, the driver's poll
  interval, reaping, Optuna tell/ask and the database writes and spec file between two
  trials) and leaves out only the one-time costs of a search (CLI imports, schema
  migration, study creation, the final summary), which a search of many trials
  amortises away. Those one-time costs are printed separately, and so is
- slotsweep, whole search: (search wall time - driver start-up before the first
  torchrun) / K, which adds the driver's shutdown after the last trial, divided by K
  (so it depends on K).

Where the time goes: rank 0 of every job writes wall-clock stamps when its interpreter
starts to exit (torchrun's and its own process start, training start and end), and the
benchmark prints the mean phases of each kind: before torchrun starts (bare: the fork;
slotsweep: the driver's work from the previous reap to this launch), torchrun start-up
(until rank 0 exists), rank set-up (imports, process group, the runtime's set-up, until
the training function starts), training (DDP construction, the steps, the averaged
loss), recording + leaving (what runs after the training function returns until the
interpreter exits: rank 0's database writes, the system-metrics sampler's last sample,
leaving the process group, the log prefixer), and exit + reap (interpreter teardown,
torchrun's exit, and for slotsweep the driver noticing it). A second table splits the
CPU time per trial: each rank's CPU until training, during it and after it (from
``getrusage`` in the rank), the rest of the job's process tree (torchrun, the log
prefixers, the interpreters' exits: the tree's total from the reaping process's
``RUSAGE_CHILDREN`` minus the ranks), and the driver's own CPU between trials, which
competes with the ranks for a small machine's cores.

Run:
    .venv/bin/python bench/launch_overhead.py            # K=5, 2 rounds
    .venv/bin/python bench/launch_overhead.py -k 10 --rounds 3
Last line (machine-readable):
    bare_s=<a> slotsweep_s=<b> ratio=<b/a> overhead_s=<b-a>
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import bench_env, epoch_s, fmt, median, run_search, scratch_folder, write_yaml

HERE = Path(__file__).resolve().parent
TRIAL_FILE = HERE / "launch_trial.py"
STAMPS_ENV = "LAUNCH_BENCH_STAMPS"
PHASES = (
    "before torchrun starts",
    "torchrun start-up",
    "rank set-up",
    "training",
    "recording + leaving",
    "exit + reap",
)


CPU_PARTS = (
    "rank 0 until training",
    "rank 0 training",
    "rank 0 after training",
    "rank 1 until training",
    "rank 1 training",
    "rank 1 after training",
    "torchrun, prefixers, exits",
    "driver between trials",
)


@dataclass
class KindResult:
    """What one kind measured over all rounds."""

    per_trial: list[float] = field(default_factory=list)  # seconds, one per trial
    phases: list[dict[str, float]] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)  # CPU seconds per trial
    whole_search: list[float] = field(default_factory=list)  # slotsweep only, per round
    startup: list[float] = field(default_factory=list)
    shutdown: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.per_trial) / len(self.per_trial)


def trial_env(stamps: Path) -> dict[str, str]:
    """The environment ``trials.launcher.start_trial`` gives torchrun, plus the stamps."""
    return bench_env(
        stamps.parent,
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        **{STAMPS_ENV: str(stamps)},
    )


def read_jobs(folder: Path, k: int, kind: str) -> list[dict[int, dict[str, Any]]]:
    """Each job's stamp records by rank, in launch order; fails unless K jobs trained."""
    path = folder / "stamps.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    jobs: dict[int, dict[int, dict[str, Any]]] = {}
    for line in lines:
        record = json.loads(line)
        jobs.setdefault(record["torchrun_pid"], {})[record["rank"]] = record
    complete = sorted(
        (job for job in jobs.values() if set(job) == {0, 1}),
        key=lambda job: job[0]["torchrun_start"],
    )
    if len(complete) != k:
        raise RuntimeError(f"{kind}: {len(complete)} of {k} jobs recorded both ranks' stamps")
    return complete


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bare_argv(script: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=0",
        str(script),
    ]


def run_bare(k: int, folder: Path, result: KindResult) -> None:
    """K bare torchrun jobs one after the other."""
    stamps = folder / "stamps-bare"
    stamps.mkdir(parents=True)
    script = folder / TRIAL_FILE.name
    env = trial_env(stamps)
    launches: list[tuple[float, float, float]] = []
    for i in range(k):
        cpu_before = children_cpu_s()
        start = time.time()
        done = subprocess.run(
            bare_argv(script),
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        end = time.time()
        if done.returncode != 0:
            # torchrun can exit 1 after a finished run (gloo teardown); the stamps
            # tell whether the job did its work.
            print(f"  bare job {i} exited {done.returncode}", file=sys.stderr)
        launches.append((start, end, children_cpu_s() - cpu_before))
        result.per_trial.append(end - start)
    jobs = read_jobs(stamps, k, "bare")
    for (start, end, tree_cpu), job in zip(launches, jobs, strict=True):
        # Each job's time is Popen -> return; "before torchrun starts" is the fork.
        result.phases.append(_phases(start, end, job[0]))
        result.cpu.append(_cpu_parts(job, tree_cpu, driver_cpu=0.0))


def run_slotsweep(k: int, folder: Path, result: KindResult) -> None:
    """One search of K trials through the ``slotsweep`` CLI."""
    from sqlalchemy import select

    from storage import Trial, TrialRun, TrialState, session_scope

    stamps = folder / "stamps-slotsweep"
    stamps.mkdir(parents=True)
    config = write_yaml(
        folder / "launch.yaml",
        {
            "name": "launch-overhead",
            "entrypoint": "launch_trial:slotsweep_main",
            "hyperparameters": {"global_batch_size": 32},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": k,
                "max_length": {"batches": 20},
                "max_concurrent_trials": 1,
                "seed": 0,
            },
            "resources": {"slots_per_trial": 2},
            "checkpoint_storage": {"path": str(folder / "checkpoints")},
            "max_restarts": 0,
        },
    )
    search = run_search(
        config, db_path=folder / "search.db", cwd=folder, env=trial_env(stamps), slots=2
    )
    with session_scope(search.db_url) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        states = [t.state for t in trials]
        session.expunge_all()
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.started_at)))
        spans = [(epoch_s(r.started_at), epoch_s(r.ended_at)) for r in runs if r.ended_at]
    if len(trials) != k or any(s != TrialState.COMPLETED for s in states) or len(spans) != k:
        raise RuntimeError(
            f"slotsweep: expected {k} completed trials with one run each, got states "
            f"{[s.value for s in states]} and {len(spans)} runs\n{search.output}\n"
            + "\n".join(_trial_report(t) for t in trials if t.state != TrialState.COMPLETED)
        )
    jobs = read_jobs(stamps, k, "slotsweep")
    # The search's span runs from the first torchrun's start to the last reap; each
    # trial's share runs from the previous trial's reap (the first: its own torchrun's
    # start) to its own reap, so the driver's work between two trials falls on the next.
    first_launch, last_reap = jobs[0][0]["torchrun_start"], spans[-1][1]
    previous_reaps = [first_launch] + [end for _, end in spans[:-1]]
    # The trials' process trees, as the driver's reaped children, shared out evenly.
    tree_cpu = search.reaped_children_cpu / k
    driver_cpu = search.driver_cpu_between(first_launch, last_reap) / k
    for previous, (_, end), job in zip(previous_reaps, spans, jobs, strict=True):
        result.per_trial.append(end - previous)
        result.phases.append(_phases(previous, end, job[0]))
        result.cpu.append(_cpu_parts(job, tree_cpu, driver_cpu))
    startup = first_launch - search.started
    result.startup.append(startup)
    result.shutdown.append(search.ended - last_reap)
    result.whole_search.append((search.wall_s - startup) / k)


def _cpu_parts(
    job: dict[int, dict[str, Any]], tree_cpu: float, driver_cpu: float
) -> dict[str, float]:
    """Where one job's CPU time went, from both ranks' stamps and its tree's total."""
    parts: dict[str, float] = {}
    for rank in (0, 1):
        r = job[rank]
        parts[f"rank {rank} until training"] = r["cpu_train_start"]
        parts[f"rank {rank} training"] = r["cpu_reported"] - r["cpu_train_start"]
        parts[f"rank {rank} after training"] = r["cpu_exiting"] - r["cpu_reported"]
    parts["torchrun, prefixers, exits"] = tree_cpu - job[0]["cpu_exiting"] - job[1]["cpu_exiting"]
    parts["driver between trials"] = driver_cpu
    return parts


def _trial_report(trial: Any) -> str:
    """A failed trial's error and the end of its log, for the exception message."""
    log = Path(trial.log_path) if trial.log_path else None
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else "(no log)"
    return f"trial {trial.id}: {trial.state.value} exit {trial.exit_code}: {trial.error}\n{tail}"


def _phases(since: float, until: float, record: dict[str, Any]) -> dict[str, float]:
    """One job's time from ``since`` (its launch, or the previous reap) to ``until``."""
    return {
        "before torchrun starts": record["torchrun_start"] - since,
        "torchrun start-up": record["process_start"] - record["torchrun_start"],
        "rank set-up": record["train_start"] - record["process_start"],
        "training": record["reported"] - record["train_start"],
        "recording + leaving": record["exiting"] - record["reported"],
        "exit + reap": until - record["exiting"],
    }


def _means(rows: list[dict[str, float]], names: tuple[str, ...]) -> dict[str, float]:
    return {name: sum(row[name] for row in rows) / len(rows) for name in names}


def prepare(folder: Path) -> None:
    folder.mkdir(parents=True)
    shutil.copy2(TRIAL_FILE, folder / TRIAL_FILE.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", type=int, default=5, help="trials per kind and round (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, order alternating (2)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up job")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    if args.k < 1 or args.rounds < 1:
        parser.error("-k and --rounds must be positive integers")

    bare, sweep = KindResult(), KindResult()
    with scratch_folder("launch-overhead-", keep=args.keep) as root:
        if not args.no_warmup:
            warm = root / "warmup"
            prepare(warm)
            run_bare(1, warm, KindResult())
        for r in range(args.rounds):
            order = ("bare", "slotsweep") if r % 2 == 0 else ("slotsweep", "bare")
            for kind in order:
                folder = root / f"round-{r}-{kind}"
                prepare(folder)
                began = time.time()
                if kind == "bare":
                    run_bare(args.k, folder, bare)
                    got = bare.per_trial[-args.k :]
                else:
                    run_slotsweep(args.k, folder, sweep)
                    got = sweep.per_trial[-args.k :]
                print(
                    f"round {r} {kind:9s}: {args.k} trials, per trial {fmt(sum(got) / len(got))} s "
                    f"(took {fmt(time.time() - began, 1)} s)",
                    flush=True,
                )

    trials = args.k * args.rounds
    print(f"\n{trials} trials of each kind ({args.rounds} rounds of K={args.k})")
    for name, measured in (("bare torchrun", bare), ("slotsweep (DB span)", sweep)):
        print(
            f"{name:20s} per trial: mean {fmt(measured.mean)} s, median "
            f"{fmt(median(measured.per_trial))} s, min {fmt(min(measured.per_trial))} s, "
            f"max {fmt(max(measured.per_trial))} s"
        )
    print(
        f"median ratio {fmt(median(sweep.per_trial) / median(bare.per_trial))}, "
        f"median overhead {fmt(median(sweep.per_trial) - median(bare.per_trial))} s"
    )
    print(
        f"slotsweep per trial, whole search ((wall - start-up before launch) / K): "
        f"{fmt(sum(sweep.whole_search) / len(sweep.whole_search))} s"
    )
    print(
        f"slotsweep one-time costs per search: start-up before the first torchrun "
        f"{fmt(sum(sweep.startup) / len(sweep.startup))} s, after the last reap "
        f"{fmt(sum(sweep.shutdown) / len(sweep.shutdown))} s"
    )
    for title, names, table in (
        ("mean wall phase (s)", PHASES, "phases"),
        ("mean CPU per trial (s)", CPU_PARTS, "cpu"),
    ):
        b_means = _means(getattr(bare, table), names)
        s_means = _means(getattr(sweep, table), names)
        print(f"\n{title:28s} {'bare':>8s} {'slotsweep':>10s} {'extra':>8s}")
        for name in names:
            b, s = b_means[name], s_means[name]
            print(f"{name:28s} {fmt(b):>8s} {fmt(s):>10s} {fmt(s - b):>8s}")
        b_total, s_total = sum(b_means.values()), sum(s_means.values())
        print(f"{'total':28s} {fmt(b_total):>8s} {fmt(s_total):>10s} {fmt(s_total - b_total):>8s}")

    a, b = bare.mean, sweep.mean
    print(f"bare_s={fmt(a)} slotsweep_s={fmt(b)} ratio={fmt(b / a)} overhead_s={fmt(b - a)}")


if __name__ == "__main__":
    main()
