"""Soak: many short trials under random kills (drivers, torchruns, ranks) and driver freezes.

Several experiments (``--experiments``, default 4) search the digits example's space at
once with random search, on one SQLite database and one local agent of ``--slots`` CPU
slots (default 4) that they share through the database. Experiments cycle through trials
of half a slot, 1 slot, 2 slots and a quarter of a slot (:data:`SIZES`; shares of one
slot, issue 52) and run up to two trials each at once, so trials of different
experiments take turns on the same slots, and share trials pack onto shared slots beside
whole-slot trials. A trial is short: ``max_length: {batches:
30}`` with a checkpoint every 10 batches, so most of its life is process start-up, the
part of a trial a crash most often hits.

While they run, a killer (seeded by ``--seed``) strikes every ``--kill-every``
seconds on average (exponential gaps), one of:

- SIGKILL to a driver (``slotsweep run`` or ``resume``) of a random unfinished
  experiment; it is resumed at once with ``slotsweep resume``, which must end or adopt
  the dead driver's trial processes before their slots are used again;
- SIGKILL to a trial's ``torchrun``, or one rank, chosen among the processes that the
  database records as running (pid and kernel start time both match, so a reused pid
  is never killed) of trials killed fewer than twice so far (on a loaded machine a
  trial's start-up alone can outlast the gap between kills); the driver must restart
  that trial from its latest checkpoint;
- a freeze: SIGSTOP to a running driver for ``--freeze-for`` seconds (default: the
  lease and 5 s more), then SIGCONT. Its leases run out meanwhile and the other
  drivers reclaim what they no longer protect; continued, it must start nothing on
  slots it lost (its claims are fenced) and go on. Its trials run on while it is
  stopped. A frozen driver may be killed too (then it is resumed as any other).

``--lease`` sets every driver's slot lease (``SLOTSWEEP_TIMINGS``; default 30 s, 5 s
with ``--quick``), so freezes past it need not be long. The first four strikes are one of each kind (in a
seeded order); later kinds are drawn with weights 1 (driver) : 2 (torchrun) : 2
(rank) : 1 (freeze). A driver that exits on its own with an error is resumed too (and
counted). When every experiment has ended, the whole database goes through
:func:`searcher.check_consistency`.

Figures: ``trials`` is the number of trials recorded (terminal or not),
``trials_per_min`` those per minute of wall time from the first driver's start to the
last driver's exit, ``utilization`` the slot-seconds held by trial processes (each
``torchrun``'s slots times its recorded lifetime, start-up and teardown included, from
``slotsweep_trial_processes``) over slots x wall time, ``restarts`` the relaunches of
trials (runs with ``attempt > 0``, whatever ended the run before), ``overlaps`` the
attempt and slot overlaps the check found (must be 0; a slot overlap is ranks holding
more than the slot at once: shares adding up to more than one slot, or a share beside
a whole-slot trial) and ``consistent`` its verdict (must be true). A share trial's
``torchrun`` counts its share of its slot in ``utilization``. Nothing is asserted: the benchmark prints what happened.

Run:
    .venv/bin/python bench/soak.py                       # 200 trials, 4 experiments, 4 slots
    .venv/bin/python bench/soak.py --trials 400 --seed 3 --keep
    .venv/bin/python bench/soak.py --quick               # 6 trials, 2 experiments (~2 min)
    .venv/bin/python bench/soak.py --seed 7 --lease 5    # freezes of 10 s instead of 35 s
Last line (machine-readable):
    trials=<n> trials_per_min=<x> utilization=<u> restarts=<r> overlaps=<o> consistent=<true|false>
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from _common import bench_env, fmt, scratch_folder, slotsweep_argv, write_yaml
from sqlalchemy import func, select

from storage import (
    Experiment,
    ExperimentState,
    ProcessRole,
    Trial,
    TrialProcess,
    get_engine,
    session_scope,
    upgrade_schema,
)
from trials.config import read_stored_resources
from trials.timings import TIMINGS_ENV_VAR, Timings, lease_timings

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits"
KINDS = ("driver", "torchrun", "rank", "freeze")
KIND_WEIGHTS = (1, 2, 2, 1)
# The lease a driver takes when --lease is not given.
DEFAULT_LEASE_S = Timings().lease_s
# A freeze outlasts the lease by this much unless --freeze-for says otherwise.
FREEZE_PAST_LEASE_S = 5.0
# A trial's torchrun or ranks are killed at most this often, so that a trial slowed down
# by a loaded machine still finishes instead of being killed at every start.
MAX_KILLS_PER_TRIAL = 2
# A driver resumed more often than this in a row without the experiment advancing is
# given up on, so a broken build ends the soak instead of looping.
MAX_SELF_EXITS = 5


# ``slots_per_trial`` of experiment i is SIZES[i % len(SIZES)]: shares of one slot among
# whole-slot trials, a share first so that even ``--quick`` (two experiments) has one.
SIZES: tuple[float, ...] = (0.5, 1, 2, 0.25)


def soak_config(index: int, *, max_trials: int, seed: int, checkpoints: Path) -> dict[str, Any]:
    """Experiment ``index`` of the soak: the example's space, short random-search trials."""
    example = yaml.safe_load((EXAMPLE / "experiment.yaml").read_text())
    hyperparameters = {
        **example["hyperparameters"],
        "global_batch_size": {"type": "categorical", "vals": [32, 64]},
    }
    return {
        **example,
        "name": f"soak-{index}",
        "hyperparameters": hyperparameters,
        "searcher": {
            "name": "random",
            "pruner": {"name": "none"},
            "metric": "val_loss",
            "smaller_is_better": True,
            "max_trials": max_trials,
            "max_length": {"batches": 30},
            "max_concurrent_trials": 2,
            "seed": seed * 1000 + index,
        },
        "resources": {"slots_per_trial": SIZES[index % len(SIZES)]},
        "min_validation_period": {"batches": 15},
        "min_checkpoint_period": {"batches": 10},
        "checkpoint_storage": {"path": str(checkpoints), "save_trial_latest": 1},
        # Several kills may hit one trial; none of them is the trial's own fault.
        "max_restarts": 10,
    }


@dataclass
class _Driver:
    """The current ``slotsweep run|resume`` process of one experiment."""

    name: str
    config: Path
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    starts: int = 0
    self_exits: int = 0
    done: bool = False
    # When a frozen (SIGSTOPped) driver is continued; None while it is not frozen.
    frozen_until: float | None = None


@dataclass
class SoakResult:
    trials: int
    wall_s: float
    slots: int
    slot_seconds: float
    kills: Counter[str]
    self_exits: int
    leftovers: int
    report: Any  # searcher.ConsistencyReport
    gave_up: list[str] = field(default_factory=list)

    @property
    def trials_per_min(self) -> float:
        return self.trials / (self.wall_s / 60.0) if self.wall_s else 0.0

    @property
    def utilization(self) -> float:
        return self.slot_seconds / (self.slots * self.wall_s) if self.wall_s else 0.0


class _Soak:
    def __init__(
        self,
        root: Path,
        *,
        slots: int,
        seed: int,
        kill_every_s: float,
        lease_s: float | None = None,
        freeze_s: float | None = None,
    ) -> None:
        self.root = root
        self.db_url = f"sqlite:///{root / 'soak.db'}"
        self.env = bench_env(root)
        if lease_s is not None:
            self.env[TIMINGS_ENV_VAR] = lease_timings(lease_s)
        self.freeze_s = (
            freeze_s
            if freeze_s is not None
            else (lease_s if lease_s is not None else DEFAULT_LEASE_S) + FREEZE_PAST_LEASE_S
        )
        self.slots = slots
        self.rng = random.Random(seed)
        self.kill_every_s = kill_every_s
        self.kills: Counter[str] = Counter()
        self.kills_per_trial: Counter[int] = Counter()
        self.self_exits = 0
        self.drivers: list[_Driver] = []
        self._first_kinds = list(KINDS)
        self.rng.shuffle(self._first_kinds)

    # ----------------------------------------------------------------- drivers
    def start(self, driver: _Driver) -> None:
        """``run`` until the experiment exists, ``resume`` afterwards; output to its log.

        An experiment that has ended (a driver killed right after it committed the end)
        is done: a resume would be refused.
        """
        if driver.log is None:
            driver.log = open(self.root / f"driver-{driver.name}.log", "ab")  # noqa: SIM115
        state = self._experiment(driver.name)
        if state is not None and state.is_terminal:
            driver.done = True
            return
        # A driver killed before it created its experiment leaves nothing to resume.
        command = ["resume", driver.name] if state is not None else ["run", str(driver.config)]
        argv = [*slotsweep_argv(), *command, "--db", self.db_url, "--slots", str(self.slots)]
        driver.log.write(f"\n=== {' '.join(command)}\n".encode())
        driver.log.flush()
        driver.process = subprocess.Popen(
            [*argv, "--no-progress"],
            cwd=self.root,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=driver.log,
            stderr=subprocess.STDOUT,
        )
        driver.frozen_until = None
        driver.starts += 1

    def reap(self) -> None:
        """Note drivers that exited by themselves: done, or resumed after an error."""
        for driver in self.drivers:
            if driver.done or driver.process is None or driver.process.poll() is None:
                continue
            code = driver.process.returncode
            state = self._experiment(driver.name)
            if code == 0 and state is not None and state.is_terminal:
                driver.done = True
                continue
            # Exit 0 without an ended experiment is a pause; anything else a failure.
            self.self_exits += 1
            driver.self_exits += 1
            print(
                f"driver {driver.name} exited {code} by itself ({self._last_line(driver)}); "
                "resuming",
                flush=True,
            )
            if driver.self_exits > MAX_SELF_EXITS:
                driver.done = True
                continue
            self.start(driver)

    def _last_line(self, driver: _Driver) -> str:
        """The last line the driver printed (its reason, for a refusal)."""
        lines = (self.root / f"driver-{driver.name}.log").read_bytes().splitlines()
        return lines[-1].decode(errors="replace").strip() if lines else "no output"

    def _experiment(self, name: str) -> ExperimentState | None:
        """The state of the newest experiment called ``name``; None before it exists."""
        with session_scope(get_engine(self.db_url, read_only=True)) as session:
            return session.scalars(
                select(Experiment.state)
                .where(Experiment.name == name)
                .order_by(Experiment.id.desc())
                .limit(1)
            ).first()

    # ----------------------------------------------------------------- kills
    def kill_one(self) -> str | None:
        """SIGKILL one driver, torchrun or rank, or freeze a driver; the kind, or None if
        nothing of that kind was alive."""
        first = bool(self._first_kinds)
        kind = (
            self._first_kinds.pop() if first else self.rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
        )
        if not self._kill(kind):
            if first:
                # Nothing of that kind runs yet (e.g. no rank recorded): try it next time.
                self._first_kinds.append(kind)
            return None
        self.kills[kind] += 1
        return kind

    def _kill(self, kind: str) -> bool:
        if kind == "freeze":
            return self._freeze()
        if kind == "driver":
            running = [
                d
                for d in self.drivers
                if not d.done and d.process is not None and d.process.poll() is None
            ]
            if not running:
                return False
            driver = self.rng.choice(running)
            assert driver.process is not None
            driver.process.kill()
            driver.process.wait()
            self.start(driver)
        else:
            role = ProcessRole.TORCHRUN if kind == "torchrun" else ProcessRole.RANK
            candidates = [
                process
                for process in live_processes(self.db_url, role)
                if self.kills_per_trial[process.trial_id] < MAX_KILLS_PER_TRIAL
            ]
            if not candidates:
                return False
            victim = self.rng.choice(candidates)
            self.kills_per_trial[victim.trial_id] += 1
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGKILL)
        return True

    def _freeze(self) -> bool:
        """SIGSTOP a running driver that is not frozen yet; :meth:`thaw` continues it."""
        running = [
            d
            for d in self.drivers
            if not d.done
            and d.frozen_until is None
            and d.process is not None
            and d.process.poll() is None
        ]
        if not running:
            return False
        driver = self.rng.choice(running)
        assert driver.process is not None
        driver.process.send_signal(signal.SIGSTOP)
        driver.frozen_until = time.monotonic() + self.freeze_s
        return True

    def thaw(self) -> None:
        """SIGCONT the frozen drivers whose freeze is over."""
        now = time.monotonic()
        for driver in self.drivers:
            if driver.frozen_until is None or driver.frozen_until > now:
                continue
            driver.frozen_until = None
            if driver.process is not None and driver.process.poll() is None:
                driver.process.send_signal(signal.SIGCONT)

    def stop_everything(self) -> None:
        """SIGKILL every driver, then every trial process the database records as running."""
        for driver in self.drivers:
            if driver.process is not None and driver.process.poll() is None:
                driver.process.kill()
                driver.process.wait()
        for role in (ProcessRole.TORCHRUN, ProcessRole.RANK):
            for process in live_processes(self.db_url, role):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)

    def next_gap(self) -> float:
        return self.rng.expovariate(1.0 / self.kill_every_s)


@dataclass(frozen=True)
class LiveProcess:
    pid: int
    trial_id: int


def live_processes(db_url: str, role: ProcessRole) -> list[LiveProcess]:
    """The recorded processes of ``role`` that still run (pid and start time both match)."""
    import psutil

    from trials.launch.processes import start_time

    with session_scope(get_engine(db_url, read_only=True)) as session:
        rows = session.execute(
            select(TrialProcess.pid, TrialProcess.create_time, TrialProcess.trial_id).where(
                TrialProcess.role == role, TrialProcess.ended_at.is_(None)
            )
        ).all()
    alive = []
    for pid, create_time, trial_id in rows:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if (
                abs(start_time(process) - create_time) < 0.01
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                alive.append(LiveProcess(int(pid), int(trial_id)))
    return alive


def slot_seconds(db_url: str, start: dt.datetime, end: dt.datetime) -> float:
    """Slot-seconds held by ``torchrun`` processes between ``start`` and ``end`` (naive UTC).

    A process still unended counts up to ``end``: it held its slots at least that long.
    """
    with session_scope(get_engine(db_url, read_only=True)) as session:
        rows = session.execute(
            select(
                TrialProcess.slots,
                TrialProcess.started_at,
                TrialProcess.ended_at,
                Experiment.config,
            )
            .join(Trial, Trial.id == TrialProcess.trial_id)
            .join(Experiment, Experiment.id == Trial.experiment_id)
            .where(TrialProcess.role == ProcessRole.TORCHRUN)
        ).all()
    total = 0.0
    for slots, began, ended, config in rows:
        lifetime = (min(ended or end, end) - max(began, start)).total_seconds()
        share = read_stored_resources(config).slot_share
        total += len(slots) * share * max(lifetime, 0.0)
    return total


def run_soak(
    root: Path,
    *,
    trials: int,
    experiments: int,
    slots: int,
    seed: int,
    kill_every_s: float,
    timeout_s: float,
    lease_s: float | None = None,
    freeze_s: float | None = None,
) -> SoakResult:
    """Run the soak in ``root`` and check the database; see the module docstring."""
    from searcher import check_consistency

    soak = _Soak(
        root,
        slots=slots,
        seed=seed,
        kill_every_s=kill_every_s,
        lease_s=lease_s,
        freeze_s=freeze_s,
    )
    upgrade_schema(soak.db_url)
    shutil.copy(EXAMPLE / "model.py", root / "model.py")
    per_experiment = [
        trials // experiments + (i < trials % experiments) for i in range(experiments)
    ]
    for index, count in enumerate(per_experiment):
        config = soak_config(index, max_trials=count, seed=seed, checkpoints=root / "checkpoints")
        soak.drivers.append(
            _Driver(name=config["name"], config=write_yaml(root / f"soak-{index}.yaml", config))
        )

    started_at = _utcnow()
    started = time.monotonic()
    for driver in soak.drivers:
        soak.start(driver)
    next_kill = started + soak.next_gap()
    try:
        while not all(d.done for d in soak.drivers):
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"the soak ran longer than {timeout_s:.0f} s")
            soak.thaw()
            soak.reap()
            if time.monotonic() >= next_kill:
                soak.kill_one()
                next_kill = time.monotonic() + soak.next_gap()
            time.sleep(0.1)
    except BaseException:
        # Interrupted or timed out: leave no search running behind the benchmark.
        soak.stop_everything()
        raise
    finally:
        for driver in soak.drivers:
            if driver.log is not None:
                driver.log.close()
    wall_s = time.monotonic() - started
    ended_at = _utcnow()

    report = check_consistency(soak.db_url)
    with session_scope(get_engine(soak.db_url, read_only=True)) as session:
        recorded = int(session.scalar(select(func.count()).select_from(Trial)) or 0)
    leftovers = sum(len(live_processes(soak.db_url, role)) for role in ProcessRole)
    return SoakResult(
        trials=recorded,
        wall_s=wall_s,
        slots=slots,
        slot_seconds=slot_seconds(soak.db_url, started_at, ended_at),
        kills=soak.kills,
        self_exits=soak.self_exits,
        leftovers=leftovers,
        report=report,
        gave_up=[d.name for d in soak.drivers if d.self_exits > MAX_SELF_EXITS],
    )


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def soak_line(result: SoakResult) -> str:
    """The machine-readable last line."""
    return (
        f"trials={result.trials} trials_per_min={fmt(result.trials_per_min, 2)} "
        f"utilization={fmt(result.utilization)} restarts={result.report.restarts} "
        f"overlaps={result.report.overlaps} "
        f"consistent={'true' if result.report.consistent else 'false'}"
    )


def print_summary(result: SoakResult) -> None:
    report = result.report
    kills = " ".join(f"{kind}={result.kills[kind]}" for kind in KINDS)
    print(f"kills and freezes: {kills}; drivers that exited by themselves: {result.self_exits}")
    if result.gave_up:
        print(f"gave up resuming: {', '.join(result.gave_up)}")
    print(
        f"wall {fmt(result.wall_s, 1)} s on {result.slots} slots; "
        f"slot-seconds of trial processes {fmt(result.slot_seconds, 1)}; "
        f"processes still running afterwards: {result.leftovers}"
    )
    print(f"check: {report.summary()}")
    for problem in itertools.islice(report.problems, 20):
        print(f"  problem: {problem}")
    if len(report.problems) > 20:
        print(f"  and {len(report.problems) - 20} more")
    print(soak_line(result), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=None, help="trials in all (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kills and the searches")
    parser.add_argument("--experiments", type=int, default=None, help="default 4 (2 with --quick)")
    parser.add_argument("--slots", type=int, default=4, help="CPU slots of the local agent")
    parser.add_argument(
        "--kill-every",
        type=float,
        default=None,
        help="mean seconds between kills (default 15; 5 with --quick)",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=None,
        help=f"every driver's slot lease in seconds (default {DEFAULT_LEASE_S:g}; 5 with --quick)",
    )
    parser.add_argument(
        "--freeze-for",
        type=float,
        default=None,
        help=f"seconds a frozen driver stays stopped (default: the lease + {FREEZE_PAST_LEASE_S:g})",
    )
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="give up after this many seconds"
    )
    parser.add_argument("--quick", action="store_true", help="6 trials, 2 experiments")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    trials = args.trials if args.trials is not None else (6 if args.quick else 200)
    experiments = args.experiments if args.experiments is not None else (2 if args.quick else 4)
    kill_every_s = (
        args.kill_every if args.kill_every is not None else (5.0 if args.quick else 15.0)
    )
    if trials < 1:
        parser.error("--trials: must be at least 1")
    if not 1 <= experiments <= trials:
        parser.error("--experiments: must be between 1 and --trials")
    if args.slots < 2:
        parser.error("--slots: must be at least 2 (one experiment in four runs trials of 2 slots)")
    if kill_every_s <= 0:
        parser.error("--kill-every: must be positive")
    if args.lease is not None and args.lease <= 0:
        parser.error("--lease: must be positive")
    if args.freeze_for is not None and args.freeze_for <= 0:
        parser.error("--freeze-for: must be positive")
    lease_s = args.lease if args.lease is not None else (5.0 if args.quick else DEFAULT_LEASE_S)
    freeze_s = args.freeze_for if args.freeze_for is not None else lease_s + FREEZE_PAST_LEASE_S
    print(
        f"soak: {trials} trials in {experiments} experiments on {args.slots} slots, "
        f"a kill or freeze every {kill_every_s:g} s on average (freezes of {freeze_s:g} s, "
        f"lease {lease_s:g} s), seed {args.seed}",
        flush=True,
    )
    with scratch_folder("slotsweep-soak-", keep=args.keep) as root:
        result = run_soak(
            root,
            trials=trials,
            experiments=experiments,
            slots=args.slots,
            seed=args.seed,
            kill_every_s=kill_every_s,
            timeout_s=args.timeout,
            lease_s=lease_s,
            freeze_s=freeze_s,
        )
    print_summary(result)


if __name__ == "__main__":
    main()
