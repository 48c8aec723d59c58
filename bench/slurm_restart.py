"""Time from a failure to the trial's restart on Slurm: a cancelled job step, a lost node.

On the two-node Slurm test cluster (``tests/slurm_cluster.py``: ``.ci/slurm.sh``, root
only, 2 CPUs per node), which this script starts with a PostgreSQL server the nodes
reach and stops at the end, one allocation of both nodes (``salloc -N2 --exclusive
--no-shell --no-kill``) runs searches of the test-only slow digits trial
(``tests/searcher/_slow_model.py``: ``SlowDigitsTrial``, a sleep in every batch, a
checkpoint every epoch, far more epochs than a case lasts, ``slots_per_trial: 2``, so
one node per attempt). Each case waits until the trial's first attempt has written a
checkpoint (so the restart restores from it, as a real one would), makes it fail, and
polls the database (every 50 ms) for the next attempt's ``TrialRun`` row:

- restart: from the failure to that row's ``started_at`` (the driver has reaped the
  failed attempt, judged it, placed the trial again and started its ``srun`` step);
- progress: from the failure to the first ``progress_at`` seen on that row (rank 0 of
  the new attempt is up and has recorded something: its processes, once the runtime
  has started, joined the process group and restored the checkpoint).

Cases:

- (a) ``scancel`` of the running attempt's job step (``TrialRun.external_id``).
- (b) the node lost: every process of the node killed at once (``SlurmCluster.stop_node``
  on ``ssnode2``: slurmd, slurmstepd and the ranks, as in a power cut). Slurm notices
  only after ``SlurmdTimeout`` (10 s on the test cluster; the step's ``srun`` exits
  about 25 s after the loss, with status 0 and "Node failure"). Thanks to ``--no-kill``
  it then drops the node from the allocation instead of revoking the allocation, which
  is what it does without ``--no-kill`` (after which no step can start at all: "Slurm
  job ... has expired"); a step asked for the dropped node fails at once ("Requested
  node configuration is not available"), also once the node is back. Before the
  driver restarts the trial it must confirm that the failed attempt's processes are
  gone, and Slurm 22.05 keeps a lost node's step listed as RUNNING until the whole job
  ends (``scancel``, ``scancel --full``, ``scancel -s KILL``, the node's return and
  ``scontrol update state=down`` all leave it); so the Slurm executor counts a step
  whose nodes all left the allocation as gone, and placement skips nodes that are down
  or left it. A lone one-node trial starts on the first node declared (``ssnode1``);
  to lose the second node instead, a "holder" search (a second driver on the same
  database, whose slot ledger both drivers share) first takes ``ssnode1``, the
  measured search's trial then starts on ``ssnode2``, and the holder is killed
  (``slotsweep kill``) before the node is lost, so that the restart has ``ssnode1`` to
  go to. The restart is awaited with the node down (``--node-loss-wait``), then with
  it started again (``--node-back-wait``); the node is started again in any case.
  When no restart comes, the case prints ``none`` and what the driver and Slurm showed
  instead (before the executor handled lost nodes, the driver waited for the old step
  for the rest of the allocation: "attempt 0 still has processes that could not be
  ended yet").

With ``--executor sbatch`` no allocation is held: the driver runs as on a login node
with a cluster file naming partition ``grace`` (GraceTime 30 s), every attempt is a
Slurm job of its own, and the cases are (a) ``scancel`` of the attempt's job and
(c) preemption: an ``urgent`` job of both nodes (``sleep 1``) preempts it, its ranks
checkpoint on the SIGTERM, and the restart is the next job's start (once the urgent
job has ended), not counted as a failure.

Run (root):
    .venv/bin/python bench/slurm_restart.py
    .venv/bin/python bench/slurm_restart.py --case scancel --batch-delay 0.2
    .venv/bin/python bench/slurm_restart.py --executor sbatch
Last line (machine-readable):
    scancel_to_restart_s=<a> scancel_to_progress_s=<b> node_loss_to_restart_s=<c>
    node_loss_to_progress_s=<d>     (one line; a case not run is left out, and a
                                     restart that never came reads "none"; with
                                     --executor sbatch preemption_to_restart_s and
                                     preemption_to_progress_s instead of node_loss)
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

from _common import bench_env, epoch_s, fmt, scratch_folder, slotsweep_argv
from launch_overhead import REPO_ROOT, SlurmTestSite, slurm_test_site

T = TypeVar("T")
POLL_S = 0.05
LOST_NODE = "ssnode2"
FIRST_NODE = "ssnode1"


@dataclass(frozen=True)
class Attempt:
    """What the database says about one attempt of the measured trial."""

    attempt: int
    started_at: float
    ended_at: float | None
    progress_at: float | None
    external_id: str | None
    nodes: tuple[str, ...]
    restored_from_step: int | None
    reason: str | None
    exit_code: int | None  # recorded when the driver reaps the attempt's srun


@dataclass(frozen=True)
class Restart:
    """One failure and the restart that followed it (wall-clock seconds)."""

    failed_at: float
    failed: Attempt  # the attempt that failed, as recorded once it was reaped
    restarted: Attempt  # the next one: its started_at, and the first progress_at seen
    exit_seen_at: float | None  # when the polls first saw the failed attempt's exit code
    note: str = ""

    @property
    def to_restart_s(self) -> float:
        return self.restarted.started_at - self.failed_at

    @property
    def to_progress_s(self) -> float:
        assert self.restarted.progress_at is not None
        return self.restarted.progress_at - self.failed_at

    def describe(self, name: str) -> str:
        """Where each attempt ran and when, relative to the failure, in one line."""
        return (
            f"{name}: attempt {self.failed.attempt} on {','.join(self.failed.nodes)} "
            f"(Slurm id {self.failed.external_id}): exit code {self.failed.exit_code} seen after "
            f"{since(self.failed_at, self.exit_seen_at)} s, ended_at after "
            f"{since(self.failed_at, self.failed.ended_at)} s; attempt {self.restarted.attempt} on "
            f"{','.join(self.restarted.nodes)} (Slurm id {self.restarted.external_id}, restored "
            f"from step {self.restarted.restored_from_step}) started after "
            f"{fmt(self.to_restart_s)} s, first progress after {fmt(self.to_progress_s)} s"
            + (f" ({self.note})" if self.note else "")
        )

    def figures(self, prefix: str) -> list[str]:
        return [
            f"{prefix}_to_restart_s={fmt(self.to_restart_s)}",
            f"{prefix}_to_progress_s={fmt(self.to_progress_s)}",
        ]


@dataclass(frozen=True)
class NoRestart:
    """A failure after which no next attempt started, and what the driver and Slurm showed."""

    failed_at: float
    waited_s: float
    exit_seen_at: float | None
    evidence: list[str]

    def describe(self, name: str) -> str:
        return "\n".join(
            [
                f"{name}: NO restart within {fmt(self.waited_s, 1)} s of the failure; the "
                f"failed attempt's exit code was recorded after "
                f"{since(self.failed_at, self.exit_seen_at)} s",
                *self.evidence,
            ]
        )

    def figures(self, prefix: str) -> list[str]:
        return [f"{prefix}_to_restart_s=none", f"{prefix}_to_progress_s=none"]


def since(start: float, moment: float | None) -> str:
    """``moment - start`` for printing; ``never`` when it did not happen."""
    return "never" if moment is None else fmt(moment - start)


def experiment_config(folder: Path, batch_delay_s: float) -> Path:
    """A one-trial search of the slow digits trial, one node per attempt, restarts allowed.

    The experiment is named after ``folder``, and so is the :class:`Driver` that runs it.
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.searcher.conftest import write_experiment

    return write_experiment(
        folder,
        name=folder.name,
        entrypoint="slow_model:SlowDigitsTrial",
        # One batch size: 22 batches per epoch, each sleeping batch_delay_s.
        hyperparameters={"global_batch_size": 64},
        searcher={
            "max_trials": 1,
            "max_length": {"epochs": 1000},
            "pruner": {"name": "none"},
        },
        resources={"slots_per_trial": 2},
        data={"batch_delay_s": batch_delay_s},
        min_checkpoint_period={"epochs": 1},
        min_validation_period={"epochs": 1},
        max_restarts=3,
        checkpoint_storage={"path": str(folder / "checkpoints")},
    )


class Driver:
    """One ``slotsweep run`` in the background inside the allocation; output to a file."""

    def __init__(
        self, config: Path, db_url: str, site: SlurmTestSite, cluster_file: Path | None = None
    ) -> None:
        self.config = config
        self.db_url = db_url
        self.name = config.parent.name
        self.env = site.environment(bench_env(config.parent))
        if cluster_file is not None:
            # One Slurm job per trial (the sbatch executor) instead of steps.
            self.env["SLOTSWEEP_CLUSTER"] = str(cluster_file)
        self.log_path = config.parent / "driver.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(
            [*slotsweep_argv(), "run", str(config), "--db", db_url, "--no-progress"],
            cwd=config.parent,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"the {self.name} driver exited {self.process.returncode}:\n{self.output()}"
            )

    def attempts(self) -> list[Attempt]:
        """Every attempt of this search's (only) trial, in order."""
        from sqlalchemy import select

        from storage import Experiment, Trial, TrialRun, session_scope

        with session_scope(self.db_url) as session:
            runs = session.scalars(
                select(TrialRun)
                .join(Trial, TrialRun.trial_id == Trial.id)
                .join(Experiment, Trial.experiment_id == Experiment.id)
                .where(Experiment.name == self.name)
                .order_by(TrialRun.attempt)
            )
            return [
                Attempt(
                    attempt=run.attempt,
                    started_at=epoch_s(run.started_at),
                    ended_at=epoch_s(run.ended_at) if run.ended_at else None,
                    progress_at=epoch_s(run.progress_at) if run.progress_at else None,
                    external_id=run.external_id,
                    nodes=tuple(str(agent["agent"]) for agent in run.agents or []),
                    restored_from_step=run.restored_from_step,
                    reason=run.reason,
                    exit_code=run.exit_code,
                )
                for run in runs
            ]

    def checkpointed(self) -> bool:
        """Whether the trial has a completed checkpoint to restart from."""
        from sqlalchemy import func, select

        from storage import Checkpoint, CheckpointState, Experiment, Trial, session_scope

        with session_scope(self.db_url) as session:
            count = session.scalar(
                select(func.count())
                .select_from(Checkpoint)
                .join(Trial, Checkpoint.trial_id == Trial.id)
                .join(Experiment, Trial.experiment_id == Experiment.id)
                .where(Experiment.name == self.name, Checkpoint.state == CheckpointState.COMPLETED)
            )
        return bool(count)

    def stop(self, timeout_s: float = 120.0) -> None:
        """``slotsweep kill`` the search and wait for the driver (SIGKILL it if it hangs).

        Its steps end with it; any left over end with the allocation.
        """
        try:
            if self.process.poll() is None:
                subprocess.run(
                    [*slotsweep_argv(), "kill", self.name, "--db", self.db_url],
                    env=self.env,
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
                try:
                    self.process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            self._log.close()


def wait_for(what: str, value: Callable[[], T | None], driver: Driver, timeout_s: float) -> T:
    """Poll ``value`` every 50 ms until it is not None; fail after ``timeout_s`` or if the
    driver exits first."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    deadline = time.monotonic() + timeout_s
    while True:
        found: T | None = None
        # The driver may not have created the schema yet.
        with contextlib.suppress(OperationalError, ProgrammingError):
            found = value()
        if found is not None:
            return found
        driver.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s:g} s:\n{driver.output()}")
        time.sleep(POLL_S)


def wait_running(driver: Driver, timeout_s: float) -> Attempt:
    """The trial's current attempt once it has progress and a checkpoint to restart from."""

    def ready() -> Attempt | None:
        attempts = driver.attempts()
        if not attempts or attempts[-1].progress_at is None or attempts[-1].external_id is None:
            return None
        return attempts[-1] if driver.checkpointed() else None

    return wait_for("running attempt with a checkpoint", ready, driver, timeout_s)


@dataclass
class Watch:
    """The polls after a failure: when they first saw the failed attempt's exit code.

    The driver records an attempt's exit code when it reaps its ``srun``, before it
    confirms that the step's processes are gone (``ended_at``) and restarts the trial.
    """

    driver: Driver
    first: Attempt
    failed_at: float
    exit_seen_at: float | None = None

    def next_attempt(self, need_progress: bool) -> Attempt | None:
        """The attempt after ``first`` once it exists (and has progress, if asked)."""
        attempts = self.driver.attempts()
        failed = next(a for a in attempts if a.attempt == self.first.attempt)
        if self.exit_seen_at is None and failed.exit_code is not None:
            self.exit_seen_at = time.time()
        later = [a for a in attempts if a.attempt > self.first.attempt]
        if not later or (need_progress and later[0].progress_at is None):
            return None
        return later[0]

    def wait_restart(self, timeout_s: float, note: str = "") -> Restart:
        """The next attempt: its start, and its first progress as the 50 ms polls see it."""
        n = self.first.attempt + 1
        wait_for(f"attempt {n}", lambda: self.next_attempt(False), self.driver, timeout_s)
        restarted = wait_for(
            f"progress of attempt {n}", lambda: self.next_attempt(True), self.driver, timeout_s
        )
        failed = next(a for a in self.driver.attempts() if a.attempt == self.first.attempt)
        return Restart(self.failed_at, failed, restarted, self.exit_seen_at, note)


def measure_scancel(
    site: SlurmTestSite, folder: Path, args: argparse.Namespace, cluster_file: Path | None = None
) -> Restart:
    """Case (a): cancel the running attempt's job step (its job, one job per trial)."""
    config = experiment_config(folder / "restart-scancel", args.batch_delay)
    driver = Driver(config, site.new_database(), site, cluster_file)
    try:
        first = wait_running(driver, args.timeout)
        assert first.external_id is not None
        failed_at = time.time()
        done = site.cluster.run("scancel", first.external_id, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"scancel {first.external_id}: {done.stderr.strip()}")
        return Watch(driver, first, failed_at).wait_restart(args.timeout)
    finally:
        driver.stop()


def measure_preemption(
    site: SlurmTestSite, folder: Path, args: argparse.Namespace, cluster_file: Path
) -> Restart:
    """Case (c), one job per trial: an ``urgent`` job of both nodes preempts the trial's.

    The trial's job is in partition ``grace`` (30 s GraceTime): its ranks checkpoint on
    the SIGTERM, and the driver submits it again; that job starts once the urgent one
    (``sleep 1``) has ended.
    """
    config = experiment_config(folder / "restart-preemption", args.batch_delay)
    driver = Driver(config, site.new_database(), site, cluster_file)
    try:
        first = wait_running(driver, args.timeout)
        failed_at = time.time()
        done = site.cluster.run(
            "sbatch", "--parsable", "-p", "urgent", "-N2", "--exclusive", "-o", "/dev/null",
            "--wrap", "sleep 1", timeout=60,
        )  # fmt: skip
        if not done.stdout.strip().isdigit():
            raise RuntimeError(f"sbatch of the urgent job: {done.stderr.strip()}")
        return Watch(driver, first, failed_at).wait_restart(args.timeout)
    finally:
        driver.stop()


def measure_node_loss(
    site: SlurmTestSite, folder: Path, args: argparse.Namespace
) -> Restart | NoRestart:
    """Case (b): lose the second node while the measured trial runs there alone.

    The restart is awaited for ``--node-loss-wait`` seconds with the node down, then
    for ``--node-back-wait`` more after starting it again; when none comes, what the
    driver and Slurm showed is returned instead.
    """
    db_url = site.new_database()
    holder = Driver(experiment_config(folder / "holder", args.batch_delay), db_url, site)
    victim: Driver | None = None
    node_stopped = False
    try:
        held = wait_for(
            "the holder's placed attempt",
            lambda: next((a for a in holder.attempts() if a.nodes), None),
            holder,
            args.timeout,
        )
        if held.nodes != (FIRST_NODE,):
            raise RuntimeError(f"the holder's trial runs on {held.nodes}, not on {FIRST_NODE}")
        config = experiment_config(folder / "restart-node-loss", args.batch_delay)
        victim = Driver(config, db_url, site)
        first = wait_running(victim, args.timeout)
        if first.nodes != (LOST_NODE,):
            raise RuntimeError(f"the measured trial runs on {first.nodes}, not on {LOST_NODE}")
        # Free the first node (in the ledger and in Slurm) before the failure, so that
        # the restart has a live node to go to.
        holder.stop()
        failed_at = time.time()
        node_stopped = True
        site.cluster.stop_node(LOST_NODE)
        watch = Watch(victim, first, failed_at)
        with contextlib.suppress(TimeoutError):
            return watch.wait_restart(args.node_loss_wait)
        evidence = [f"with {LOST_NODE} down for {fmt(time.time() - failed_at, 1)} s:"]
        evidence += slurm_evidence(site, victim, first)
        site.cluster.start_node(LOST_NODE)
        node_stopped = False
        back_s = time.time() - failed_at
        try:
            return watch.wait_restart(
                args.node_back_wait,
                note=f"only after {LOST_NODE} was started again, {fmt(back_s, 1)} s after its loss",
            )
        except TimeoutError:
            evidence.append(f"{LOST_NODE} started again after {fmt(back_s, 1)} s; then:")
            evidence += slurm_evidence(site, victim, first)
            return NoRestart(failed_at, time.time() - failed_at, watch.exit_seen_at, evidence)
    finally:
        if victim is not None:
            victim.stop()
        holder.stop()
        if node_stopped:
            site.cluster.start_node(LOST_NODE)


def slurm_evidence(site: SlurmTestSite, driver: Driver, failed: Attempt) -> list[str]:
    """What the driver said last, and what Slurm shows of the allocation and its steps."""
    lines = driver.output().strip().splitlines()
    now = next((a for a in driver.attempts() if a.attempt == failed.attempt), failed)
    steps = site.cluster.run("squeue", "-h", "-s", "-j", site.job_id, "-o", "%i %j %N")
    return [
        f"  the driver's last line: {lines[-1] if lines else '(none)'}",
        f"  attempt {failed.attempt}: ended_at {'set' if now.ended_at else 'unset'}, "
        f"reason {now.reason!r}",
        f"  the job's nodes now: {site.cluster.job(site.job_id).get('NodeList')}",
        "  its steps (squeue -s): " + ("; ".join(steps.stdout.strip().splitlines()) or "(none)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--executor",
        choices=("slurm", "sbatch"),
        default="slurm",
        help="attempts as job steps of one allocation (slurm, default) or as one Slurm job "
        "per trial (sbatch)",
    )
    parser.add_argument(
        "--case",
        choices=("both", "scancel", "node-loss", "preemption"),
        default="both",
        help="which failure to measure (default both: scancel, then node-loss for "
        "--executor slurm, preemption for sbatch)",
    )
    parser.add_argument(
        "--batch-delay",
        type=float,
        default=0.2,
        help="seconds each training batch sleeps (default 0.2: about 5 s per epoch)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each step (300)"
    )
    parser.add_argument(
        "--node-loss-wait",
        type=float,
        default=120.0,
        help="seconds to wait for the restart with the node down (120)",
    )
    parser.add_argument(
        "--node-back-wait",
        type=float,
        default=60.0,
        help="then seconds to wait with the node started again (60)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    cases = {
        "slurm": ("scancel", "node-loss"),
        "sbatch": ("scancel", "preemption"),
    }[args.executor]
    if args.case != "both" and args.case not in cases:
        parser.error(f"--case {args.case} is not a case of --executor {args.executor}")
    run_cases = cases if args.case == "both" else (args.case,)

    figures: list[str] = []
    if args.executor == "sbatch":
        with (
            slurm_test_site(allocate=False) as site,
            scratch_folder("slurm-restart-", keep=args.keep) as root,
        ):
            cluster_file = root / "cluster.yaml"
            cluster_file.write_text(
                "executor: slurm\nslurm: {partition: grace, time_limit: '60', slot_type: cpu}\n"
            )
            print(f"sbatch: partition grace, PostgreSQL {site.postgres.url}", flush=True)
            if "scancel" in run_cases:
                restart = measure_scancel(site, root, args, cluster_file)
                print(restart.describe("scancel"), flush=True)
                figures += restart.figures("scancel")
            if "preemption" in run_cases:
                restart = measure_preemption(site, root, args, cluster_file)
                print(restart.describe("preemption"), flush=True)
                figures += restart.figures("preemption")
        print(" ".join(figures))
        return
    with (
        slurm_test_site(no_kill=True) as site,
        scratch_folder("slurm-restart-", keep=args.keep) as root,
    ):
        print(
            f"slurm: allocation {site.job_id} (--no-kill) of {site.env['SLURM_JOB_NODELIST']}, "
            f"PostgreSQL {site.postgres.url}",
            flush=True,
        )
        if "scancel" in run_cases:
            restart = measure_scancel(site, root, args)
            print(restart.describe("scancel"), flush=True)
            figures += restart.figures("scancel")
        if "node-loss" in run_cases:
            outcome = measure_node_loss(site, root, args)
            print(outcome.describe("node loss"), flush=True)
            figures += outcome.figures("node_loss")
    print(" ".join(figures))


if __name__ == "__main__":
    main()
