"""Per-trial launch overhead of slotsweep against bare ``torchrun``, here, on Slurm or Ray.

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
  reports the averaged loss as ``val_loss`` so every trial completes;
- with ``--warm``, also slotsweep warm: the same search with ``resources.reuse_workers:
  true``, so the first trial starts torchrun and every later one is handed to that
  job's waiting ranks (no new processes, no new process group; the ranks import
  ``launch_trial`` afresh and build a new context and model for each trial).

Where (``--executor``):

- ``local`` (default): both on this machine; the search runs the local executor with
  ``--slots 2`` on a SQLite database.
- ``slurm``: both as job steps of one Slurm allocation on the two-node test cluster
  (``tests/slurm_cluster.py``: ``.ci/slurm.sh``, root only, 2 CPUs per node), which the
  benchmark starts together with a PostgreSQL server the nodes reach, allocates
  (``salloc -N2 --exclusive --no-shell``) and stops again at the end. Bare: each job
  is ``srun --jobid=J --nodes=1 --ntasks=1 --exact --cpus-per-task=2`` in front of the
  torchrun command above (one job step per trial, Slurm picks the node); slotsweep: the
  search runs with the allocation's environment (``SLURM_JOB_ID``,
  ``SLURM_JOB_NODELIST``, ``SLURM_JOB_CPUS_PER_NODE``), so its Slurm executor makes
  every trial one ``srun`` step of one node (both CPUs), and its ranks record to a fresh
  PostgreSQL database per round.
- ``sbatch``: one Slurm job per trial on the same test cluster, with no allocation
  held. Bare: each job is ``srun --partition=debug --nodes=1 --ntasks=1
  --cpus-per-task=2`` in front of the torchrun command (srun outside an allocation
  makes a job of its own); slotsweep: the search's cluster file names the partition
  (``executor: slurm`` with a ``slurm:`` block), so every trial is one ``sbatch`` job
  whose script runs one ``srun`` step of the node wrapper and torchrun.
- ``ray``: on the Ray test cluster (``tests/ray_cluster.py``: ``.ci/ray.sh``, root only,
  a head without CPUs and two worker nodes of 2 CPUs), started here with a PostgreSQL
  server its nodes reach and stopped at the end. Bare: torchrun in worker node
  raynode1's network namespace (``nsenter --net``, as if started on that machine);
  slotsweep: the Ray executor (``executor: ray``), each trial a placement group on one
  worker node and its node runner's torchrun; warm always runs too; and a fourth kind, Ray
  Tune with Ray Train: ``bench/launch_tune.py``, a ``tune.Tuner`` of K trials one at a
  time, each a ``TorchTrainer`` of 2 workers running the same training function, its
  per-trial cost ``Tuner.fit()``'s wall time / K (``ray.init`` printed apart). The
  trial's stamps folder reaches the ranks as the hyperparameter ``stamps_dir`` (a Ray
  node's ranks start with that node's environment, not the driver's).

All run in the same invocation, in ``--rounds`` rounds whose order alternates (bare
first, then slotsweep first, ...; with ``--warm`` bare, cold, warm, then warm, cold,
bare, ...), after one untimed bare warm-up job; each round uses a fresh temporary folder
and database. ``--warm`` runs locally or inside the Slurm allocation (``--executor
slurm``); the sbatch executor submits each trial as its own job and has no warm workers.

Per-trial cost:

- bare: the wall time of each ``torchrun`` (``srun`` on Slurm), start to exit, averaged.
- slotsweep, headline: the search's span in the database, from the first trial's
  torchrun start (the process's start time, which rank 0 reads from /proc) to the last
  trial's reap (``trial_runs.ended_at`` of the last run), divided by K. This is the
  cadence of a search in steady state: it contains everything the platform adds per
  trial (the worker's set-up in the ranks, rank 0's recording, the driver's poll
  interval, reaping, Optuna tell/ask and the database writes and spec between two
  trials, and on Slurm the step's start and end) and leaves out only the one-time costs
  of a search (CLI imports, schema migration, study creation, the final summary), which
  a search of many trials amortises away. Those one-time costs are printed separately,
  and so is
- slotsweep, whole search: (search wall time - driver start-up before the first
  torchrun) / K, which adds the driver's shutdown after the last trial, divided by K
  (so it depends on K).
- slotsweep warm (``--warm``), headline: measured as the cold headline, the search's
  span in the database / K, from the first trial's torchrun start to the last trial's
  ``trial_runs.ended_at``, which on a warm job is when the driver sees the trial handed
  back. Each trial has its own run row (its ``started_at`` is the hand-over), so a
  trial's share again runs from the previous trial's end to its own. The first trial
  still starts torchrun and its ranks, and the headline shares that cold start over the
  K trials: it depends on K, and the summary also prints the first and the later
  trials apart (the later ones are what a long search pays per trial).

Where the time goes: rank 0 of every job writes wall-clock stamps when its interpreter
starts to exit (torchrun's and its own process start, training start and end), and the
benchmark prints the mean phases of each kind: the driver's work from the previous reap
to this launch (the run's ``started_at``; none for bare), from the launch until torchrun
starts (bare: the fork, and on Slurm the step's creation and slurmstepd; slotsweep: the
executor's launch, on Slurm the same step creation, on Ray the placement group, the
node's runner and its start of torchrun), torchrun start-up
(until rank 0 exists), rank set-up (imports, process group, the runtime's set-up, until
the training function starts), training (DDP construction, the steps, the averaged
loss), recording + leaving (what runs after the training function returns until the
interpreter exits: rank 0's database writes, the system-metrics sampler's last sample,
leaving the process group, the log prefixer), and exit + reap (interpreter teardown,
torchrun's exit, on Slurm the step's end and ``srun``'s exit, and for slotsweep the
driver noticing it). A second table splits the CPU time per trial: each rank's CPU
until training, during it and after it (from ``getrusage`` in the rank), the launching
side's other processes, and the driver's own CPU between trials, which competes with
the ranks for a small machine's cores. Locally that other row is the rest of the job's
process tree (torchrun, the log prefixers, the interpreters' exits: the tree's total
from the reaping process's ``RUSAGE_CHILDREN`` minus the ranks); on Slurm the job runs
under slurmstepd, outside this process tree, so the row holds only the Slurm clients
that this process or the driver ran and reaped (``srun``; for slotsweep also its
``squeue`` and ``scontrol`` calls), and torchrun's own CPU is not counted at all. For
slotsweep that row also holds, shared out over the K trials, the driver's one-time
entrypoint check before the first launch (a Python process that imports the model
module, and so torch: about 2 CPU seconds).

Warm trials (``--warm``) have no process start or exit of their own: their ranks' start
and exit stamps are the job's (``launch_trial`` writes one line per trial, all when the
job's ranks exit). So the warm kind has its own wall table, with a job's first trial and
the later trials apart: the driver's work from the previous trial's end to the launch or
hand-over (the run's ``started_at``), torchrun start-up (a job's first trial only;
"n/a" for the others), the ranks from their start or the hand-over to the import of the
trial's module (for a later trial: rank 0's poll of the job's row, the broadcast, the
reset between trials, the trial's recorder and sampler), the import and the context
until training, training, and the rest until the driver sees the trial handed back
(recording, rank 0's hand back, the driver's poll). Its "all" column is the mean over
the K trials (a phase a trial lacks counting 0), which sums to the headline. Its CPU
goes in the same table as the others' (the process-start and exit phases of the bare
and cold tables do not exist for it): a later trial's "until training" runs from the
previous trial's report on the same ranks (hand back, wait, reset, set-up), "after
training" is nonzero only on a job's last trial (the job's end), and the job's other
processes are shared out over its trials.

K (``-k``) is 5 by default and 10 with ``--warm``: the warm headline shares the job's
one cold start (a bare torchrun's cost) over the K trials, so it alone puts a floor of
1/K under ``warm_ratio``; at K = 5 that floor is 0.2, the target itself, while a search
that prunes runs tens of trials on its jobs. The later trials' own cost is printed
apart, and ``-k 5 --warm`` still measures the short case.

Run:
    .venv/bin/python bench/launch_overhead.py            # K=5, 2 rounds, local
    .venv/bin/python bench/launch_overhead.py -k 10 --rounds 3
    .venv/bin/python bench/launch_overhead.py --executor slurm   # as root
    .venv/bin/python bench/launch_overhead.py --executor sbatch  # as root
    .venv/bin/python bench/launch_overhead.py --executor ray     # as root; warm and Tune too
    .venv/bin/python bench/launch_overhead.py --warm     # bare, cold and warm, K=10
Last line (machine-readable):
    bare_s=<a> slotsweep_s=<b> ratio=<b/a> overhead_s=<b-a>
    bare_s=<a> cold_s=<b> warm_s=<c> warm_ratio=<c/a>        # with --warm
    bare_s=<a> slotsweep_ray_s=<b> slotsweep_ray_warm_s=<w> ray_tune_s=<c> ratio_vs_bare=<b/a> ratio_vs_tune=<b/c>  # --executor ray
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import bench_env, epoch_s, fmt, median, run_search, scratch_folder, write_yaml

if TYPE_CHECKING:
    from tests.conftest import PostgresServer
    from tests.ray_cluster import RayCluster
    from tests.slurm_cluster import SlurmCluster

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
TRIAL_FILE = HERE / "launch_trial.py"
STAMPS_ENV = "LAUNCH_BENCH_STAMPS"
# The warm headline shares a job's cold first trial over K trials (see the module).
COLD_DEFAULT_K = 5
WARM_DEFAULT_K = 10
PHASES = (
    "driver: reap -> launch",
    "launch -> torchrun starts",
    "torchrun start-up",
    "rank set-up",
    "training",
    "recording + leaving",
    "exit + reap",
)
RANK_CPU_PARTS = (
    "rank 0 until training",
    "rank 0 training",
    "rank 0 after training",
    "rank 1 until training",
    "rank 1 training",
    "rank 1 after training",
)
DRIVER_CPU_PART = "driver between trials"
# A warm search's trials (``--warm``): the first trial of a job starts its torchrun, the
# later ones are handed to the job's waiting ranks, so the phases differ from a cold
# trial's and some exist for one kind of warm trial only.
WARM_PHASES = (
    "driver: reap -> launch/hand-over",
    "torchrun start-up",
    "ranks: start/hand-over -> import",
    "import + context -> training",
    "training",
    "recording + hand back + reap",
)
# The phase only a job's first trial has (later trials find the ranks running).
FIRST_TRIAL_ONLY = "torchrun start-up"


@dataclass
class KindResult:
    """What one kind measured over all rounds."""

    per_trial: list[float] = field(default_factory=list)  # seconds, one per trial
    phases: list[dict[str, float]] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)  # CPU seconds per trial
    whole_search: list[float] = field(default_factory=list)  # slotsweep only, per round
    # Warm only: whether each trial was its job's first (started torchrun), and the
    # number of torchrun jobs per round.
    first_of_job: list[bool] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    startup: list[float] = field(default_factory=list)
    shutdown: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.per_trial) / len(self.per_trial)


@dataclass(frozen=True)
class Site:
    """Where both kinds run their jobs: what differs between ``--executor`` values.

    Everything else (the job, the search's config, the stamps, the arithmetic) is the
    same code for every site, so the two modes measure the same things.
    """

    executor: str  # "local" or "slurm"
    # Put in front of the bare torchrun command: ``srun ...`` on Slurm, nothing locally.
    bare_prefix: tuple[str, ...]
    # A job's or search's environment from the local one: the same here; on Slurm the
    # cluster's client settings and the allocation's variables added.
    environment: Callable[[dict[str, str]], dict[str, str]]
    # ``slotsweep run --slots``: the local agent's size; None on Slurm, whose
    # allocation gives each node's slots.
    slots: int | None
    # A fresh database URL for one round's search, given the round's folder.
    new_database: Callable[[Path], str]
    # The CPU row of the launching side's reaped children, and whether those children
    # include the ranks (locally the whole torchrun tree; on Slurm only the clients).
    tree_part: str
    tree_holds_ranks: bool

    @property
    def cpu_parts(self) -> tuple[str, ...]:
        return (*RANK_CPU_PARTS, self.tree_part, DRIVER_CPU_PART)

    def job_env(self, stamps: Path) -> dict[str, str]:
        """The environment of a bare job or a search (whose trials inherit it)."""
        return self.environment(trial_env(stamps))


def local_site() -> Site:
    """This machine: bare torchrun from this process, the search's local executor on SQLite."""
    return Site(
        executor="local",
        bare_prefix=(),
        environment=dict,
        slots=2,
        new_database=lambda folder: f"sqlite:///{folder / 'search.db'}",
        tree_part="torchrun, prefixers, exits",
        tree_holds_ranks=True,
    )


@dataclass(frozen=True)
class SlurmTestSite:
    """The Slurm test cluster, a PostgreSQL server its nodes reach, and one allocation."""

    cluster: SlurmCluster
    postgres: PostgresServer
    job_id: str
    # What ``salloc`` gives its command: the cluster's client settings (SLURM_CONF)
    # and the allocation's SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_JOB_CPUS_PER_NODE.
    env: dict[str, str]

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` as a command inside the allocation sees it (``salloc CMD`` would).

        A SLURM_* of a job this benchmark itself runs in would send the clients to
        that job, so those are dropped first.
        """
        kept = {key: value for key, value in base.items() if not key.startswith("SLURM_")}
        return {**kept, **self.env}

    def new_database(self, folder: Path | None = None) -> str:
        """A new, empty database on the server (the search migrates it); its URL."""
        return new_postgres_database(self.postgres)


def new_postgres_database(postgres: PostgresServer) -> str:
    """A new, empty database on ``postgres`` (the search migrates it); its URL."""
    import sqlalchemy as sa

    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(
        postgres.url.replace("postgresql://", "postgresql+psycopg://"),
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return postgres.url.rsplit("/", 1)[0] + f"/{name}"


@contextlib.contextmanager
def slurm_test_site(*, no_kill: bool = False, allocate: bool = True) -> Iterator[SlurmTestSite]:
    """Start the two-node Slurm test cluster and PostgreSQL, allocate both nodes; stop all.

    ``no_kill`` allocates with ``salloc --no-kill``: a failed node leaves the
    allocation instead of revoking it. ``allocate=False`` holds no allocation (a login
    node's view: ``job_id`` is empty and ``env`` has the client settings only). Everything started here is stopped on the way
    out, also after an error, Ctrl-C or SIGTERM (which becomes a SystemExit here), so
    no daemon, namespace or database server is left running.
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.slurm_cluster import SlurmCluster

    cluster = SlurmCluster()
    with started_with_postgres(cluster) as postgres:
        if not allocate:
            yield SlurmTestSite(cluster, postgres, "", dict(cluster.env))
            return
        job_id = cluster.allocate(no_kill=no_kill, name="bench")
        try:
            env = cluster.allocation_env(job_id)
            yield SlurmTestSite(cluster, postgres, job_id, env)
        finally:
            cluster.run("scancel", job_id, timeout=60)


@contextlib.contextmanager
def started_with_postgres(cluster: SlurmCluster | RayCluster) -> Iterator[PostgresServer]:
    """Start a test cluster and a PostgreSQL server on its bridge address, which its
    nodes reach; the server. Both are stopped on the way out, also after an error,
    Ctrl-C or SIGTERM (which becomes a SystemExit here)."""
    from tests.conftest import PostgresServer

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        cluster.start()
        prefix = cluster.subnet.split("/")[1]
        postgres = PostgresServer(listen_address=f"{cluster.controller_address}/{prefix}")
        postgres.start()
        try:
            yield postgres
        finally:
            postgres.remove()
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)


def slurm_site(test_site: SlurmTestSite) -> Site:
    """Job steps of ``test_site``'s allocation: bare ``srun`` steps, the Slurm executor."""
    return Site(
        executor="slurm",
        bare_prefix=(
            "srun",
            f"--jobid={test_site.job_id}",
            "--nodes=1",
            "--ntasks=1",
            "--exact",
            "--cpus-per-task=2",
        ),
        environment=test_site.environment,
        slots=None,
        new_database=test_site.new_database,
        tree_part="srun, squeue, entry probe",
        tree_holds_ranks=False,
    )


def sbatch_site(test_site: SlurmTestSite, cluster_file: Path) -> Site:
    """One Slurm job per trial: bare ``srun`` jobs from outside any allocation, and the
    search's sbatch executor (a cluster file naming the ``debug`` partition)."""
    cluster_file.write_text(
        "executor: slurm\nslurm: {partition: debug, time_limit: '30', slot_type: cpu}\n"
    )

    def environment(base: dict[str, str]) -> dict[str, str]:
        return {**test_site.environment(base), "SLOTSWEEP_CLUSTER": str(cluster_file)}

    return Site(
        executor="sbatch",
        # srun outside an allocation: a job of its own per trial, with its one step.
        bare_prefix=("srun", "--partition=debug", "--nodes=1", "--ntasks=1", "--cpus-per-task=2"),
        environment=environment,
        slots=None,
        new_database=test_site.new_database,
        tree_part="sbatch, srun, squeue, probe",
        tree_holds_ranks=False,
    )


@contextlib.contextmanager
def ray_test_site(cluster_file: Path) -> Iterator[Site]:
    """The Ray test cluster (``.ci/ray.sh``: a head and two worker nodes of 2 CPUs) and a
    PostgreSQL server its nodes reach, started here and stopped on the way out; its site.

    Bare: torchrun in worker node raynode1's network namespace (``nsenter``), as if
    started on that machine; slotsweep: the Ray executor (``executor: ray``), whose
    trials of 2 slots fill one worker node.
    """
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from tests.ray_cluster import RayCluster

    cluster = RayCluster()
    with started_with_postgres(cluster) as postgres:
        cluster_file.write_text(f"executor: ray\nray: {{address: '{cluster.address}'}}\n")
        print(f"ray: {cluster.address}, PostgreSQL {postgres.url}", flush=True)
        yield Site(
            executor="ray",
            bare_prefix=cluster.on_node("raynode1"),
            environment=lambda base: {
                **base,
                "SLOTSWEEP_CLUSTER": str(cluster_file),
                "RAY_ADDRESS": cluster.address,
            },
            slots=None,
            new_database=lambda folder: new_postgres_database(postgres),
            # Bare: torchrun's whole tree (ranks counted apart); slotsweep: the
            # driver's own children only (the ranks run under Ray's workers).
            tree_part="reaped children",
            tree_holds_ranks=False,
        )


def run_tune(k: int, folder: Path, result: KindResult, site: Site) -> None:
    """K trials of Ray Tune, each a Ray Train TorchTrainer (``bench/launch_tune.py``).

    Per trial: ``Tuner.fit()``'s wall time / K (``ray.init`` kept apart, as startup).
    """
    done = subprocess.run(
        [sys.executable, str(HERE / "launch_tune.py"), str(k), str(folder / "tune-storage")],
        cwd=folder,
        env=site.job_env(folder / "stamps-tune"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"ray tune exited {done.returncode}:\n{done.stderr[-4000:]}")
    measured = json.loads(lines[-1])
    if measured["completed"] != k:
        raise RuntimeError(f"ray tune: {measured['completed']} of {k} trials completed")
    result.per_trial += [measured["fit_s"] / k] * k
    result.startup.append(measured["init_s"])


def trial_env(stamps: Path) -> dict[str, str]:
    """The environment ``trials.launch.launcher.start_trial`` gives torchrun, plus the stamps."""
    return bench_env(
        stamps.parent,
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        **{STAMPS_ENV: str(stamps)},
    )


def read_jobs(folder: Path, k: int, kind: str) -> list[dict[int, dict[str, Any]]]:
    """Each trial's stamp records by rank, in launch order; fails unless K trials trained.

    A trial is one torchrun job, except on a warm job, whose ranks write one record per
    trial they ran (told apart by ``trial_id``) and so share the torchrun pid.
    """
    path = folder / "stamps.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    jobs: dict[tuple[int, int | None], dict[int, dict[str, Any]]] = {}
    for line in lines:
        record = json.loads(line)
        key = (record["torchrun_pid"], record.get("trial_id"))
        jobs.setdefault(key, {})[record["rank"]] = record
    complete = sorted(
        (job for job in jobs.values() if set(job) == {0, 1}),
        key=lambda job: (job[0]["torchrun_start"], job[0]["train_start"]),
    )
    if len(complete) != k:
        raise RuntimeError(f"{kind}: {len(complete)} of {k} trials recorded both ranks' stamps")
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


def run_bare(k: int, folder: Path, result: KindResult, site: Site) -> None:
    """K bare torchrun jobs one after the other (each one ``srun`` step on Slurm)."""
    stamps = folder / "stamps-bare"
    stamps.mkdir(parents=True)
    script = folder / TRIAL_FILE.name
    env = site.job_env(stamps)
    launches: list[tuple[float, float, float]] = []
    for i in range(k):
        cpu_before = children_cpu_s()
        start = time.time()
        done = subprocess.run(
            [*site.bare_prefix, *bare_argv(script)],
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
        # Each job's time is Popen -> return; "launch -> torchrun starts" is the fork
        # (and on Slurm the step's creation).
        result.phases.append(_phases(start, end, job[0]))
        result.cpu.append(_cpu_parts(job, site, tree_cpu, driver_cpu=0.0))


def run_slotsweep(
    k: int, folder: Path, result: KindResult, site: Site, *, warm: bool = False
) -> None:
    """One search of K trials through the ``slotsweep`` CLI, with ``site``'s executor.

    ``warm``: with ``resources.reuse_workers``, so that the trials after the first run
    on the first trial's torchrun job.
    """
    from sqlalchemy import select

    from storage import Trial, TrialRun, TrialState, session_scope

    kind = "warm" if warm else "slotsweep"
    stamps = folder / f"stamps-{kind}"
    stamps.mkdir(parents=True)
    config = write_yaml(
        folder / "launch.yaml",
        {
            "name": "launch-overhead",
            "entrypoint": "launch_trial:slotsweep_main",
            "hyperparameters": {"global_batch_size": 32, "stamps_dir": str(stamps)},
            "searcher": {
                "name": "random",
                "metric": "val_loss",
                "max_trials": k,
                "max_length": {"batches": 20},
                "max_concurrent_trials": 1,
                "seed": 0,
            },
            "resources": {"slots_per_trial": 2, "reuse_workers": warm},
            "checkpoint_storage": {"path": str(folder / "checkpoints")},
            "max_restarts": 0,
        },
    )
    search = run_search(
        config,
        db_url=site.new_database(folder),
        cwd=folder,
        env=site.job_env(stamps),
        slots=site.slots,
    )
    with session_scope(search.db_url) as session:
        trials = list(session.scalars(select(Trial).order_by(Trial.id)))
        states = [t.state for t in trials]
        session.expunge_all()
        runs = list(session.scalars(select(TrialRun).order_by(TrialRun.started_at)))
        spans = [(epoch_s(r.started_at), epoch_s(r.ended_at)) for r in runs if r.ended_at]
        run_trials = [r.trial_id for r in runs if r.ended_at]
    if len(trials) != k or any(s != TrialState.COMPLETED for s in states) or len(spans) != k:
        raise RuntimeError(
            f"{kind}: expected {k} completed trials with one run each, got states "
            f"{[s.value for s in states]} and {len(spans)} runs\n{search.output}\n"
            + "\n".join(_trial_report(t) for t in trials if t.state != TrialState.COMPLETED)
        )
    # Each run's stamps, by trial (the runs are in start order, as the trials ran).
    by_trial = {job[0]["trial_id"]: job for job in read_jobs(stamps, k, kind)}
    if sorted(by_trial) != sorted(run_trials):
        raise RuntimeError(f"{kind}: stamps of trials {sorted(by_trial)}, runs of {run_trials}")
    jobs = [by_trial[trial_id] for trial_id in run_trials]
    # The search's span runs from the first torchrun's start to the last reap; each
    # trial's share runs from the previous trial's reap (the first: its own torchrun's
    # start) to its own reap, so the driver's work between two trials falls on the next.
    # On a warm job the "reap" is the driver seeing the trial handed back.
    first_launch, last_reap = jobs[0][0]["torchrun_start"], spans[-1][1]
    previous_reaps = [first_launch] + [end for _, end in spans[:-1]]
    driver_cpu = search.driver_cpu_between(first_launch, last_reap) / k
    if warm:
        phases, cpu = warm_breakdown(previous_reaps, spans, jobs, site, search.reaped_children_cpu)
        for previous, (_, end), trial_phases, trial_cpu in zip(
            previous_reaps, spans, phases, cpu, strict=True
        ):
            result.per_trial.append(end - previous)
            result.phases.append(trial_phases)
            result.cpu.append({**trial_cpu, DRIVER_CPU_PART: driver_cpu})
        pids = [job[0]["torchrun_pid"] for job in jobs]
        result.first_of_job += [i == 0 or pid != pids[i - 1] for i, pid in enumerate(pids)]
        result.jobs.append(len(set(pids)))
    else:
        # The driver's reaped children (the trials' process trees locally, the Slurm
        # clients on Slurm), shared out evenly.
        tree_cpu = search.reaped_children_cpu / k
        for previous, (started, end), job in zip(previous_reaps, spans, jobs, strict=True):
            result.per_trial.append(end - previous)
            result.phases.append(_phases(previous, end, job[0], launched=started))
            result.cpu.append(_cpu_parts(job, site, tree_cpu, driver_cpu))
    startup = first_launch - search.started
    result.startup.append(startup)
    result.shutdown.append(search.ended - last_reap)
    result.whole_search.append((search.wall_s - startup) / k)


def _cpu_parts(
    job: dict[int, dict[str, Any]], site: Site, tree_cpu: float, driver_cpu: float
) -> dict[str, float]:
    """Where one job's CPU time went, from both ranks' stamps and its reaped children's.

    Locally the reaped children are the job's whole tree, ranks included, so the ranks'
    own CPU is taken out of that row; on Slurm they are only the clients.
    """
    parts: dict[str, float] = {}
    for rank in (0, 1):
        r = job[rank]
        parts[f"rank {rank} until training"] = r["cpu_train_start"]
        parts[f"rank {rank} training"] = r["cpu_reported"] - r["cpu_train_start"]
        parts[f"rank {rank} after training"] = r["cpu_exiting"] - r["cpu_reported"]
    ranks_cpu = job[0]["cpu_exiting"] + job[1]["cpu_exiting"]
    parts[site.tree_part] = tree_cpu - ranks_cpu if site.tree_holds_ranks else tree_cpu
    parts[DRIVER_CPU_PART] = driver_cpu
    return parts


def warm_breakdown(
    previous_reaps: list[float],
    spans: list[tuple[float, float]],
    jobs: list[dict[int, dict[str, Any]]],
    site: Site,
    reaped_children_cpu: float,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Wall phases and CPU parts (but the driver's) of each trial of a warm search.

    ``spans`` are the runs' (started_at, ended_at), ``jobs`` their ranks' stamps, both in
    run order. A job's first trial starts torchrun and its ranks as a cold trial does;
    a later trial starts when the driver hands it over (its run's ``started_at``) and
    its ranks begin by importing the module afresh; every trial ends when the driver
    sees it handed back. Phases that a trial does not have are left out of its dict
    (not counted as zero), so their means are over the trials that have them.

    Ranks' CPU, from their cumulative ``getrusage`` stamps: "until training" runs from
    the previous trial's report on the same process (its hand back, the wait, the reset
    and the next trial's set-up) or from the process's start; "after training" is
    nonzero only for a job's last trial (the job's end: hand back, wait, exit). The
    launching side's other processes (locally the job's tree less its ranks) are shared
    out evenly over the trials, as in a cold search.
    """
    phases: list[dict[str, float]] = []
    cpu: list[dict[str, float]] = []
    pids = [job[0]["torchrun_pid"] for job in jobs]
    ranks_exit_cpu: dict[int, float] = {}
    for pid, job in zip(pids, jobs, strict=True):
        exiting = job[0]["cpu_exiting"] + job[1]["cpu_exiting"]
        ranks_exit_cpu[pid] = max(ranks_exit_cpu.get(pid, 0.0), exiting)
    tree_cpu = reaped_children_cpu
    if site.tree_holds_ranks:
        tree_cpu -= sum(ranks_exit_cpu.values())
    for i, (previous, (started, ended), job) in enumerate(
        zip(previous_reaps, spans, jobs, strict=True)
    ):
        first = i == 0 or pids[i] != pids[i - 1]
        last = i == len(jobs) - 1 or pids[i] != pids[i + 1]
        r0 = job[0]
        trial: dict[str, float] = {}
        if first:
            trial["driver: reap -> launch/hand-over"] = r0["torchrun_start"] - previous
            trial[FIRST_TRIAL_ONLY] = r0["process_start"] - r0["torchrun_start"]
            trial["ranks: start/hand-over -> import"] = r0["module_import"] - r0["process_start"]
        else:
            trial["driver: reap -> launch/hand-over"] = started - previous
            trial["ranks: start/hand-over -> import"] = r0["module_import"] - started
        trial["import + context -> training"] = r0["train_start"] - r0["module_import"]
        trial["training"] = r0["reported"] - r0["train_start"]
        trial["recording + hand back + reap"] = ended - r0["reported"]
        phases.append(trial)
        parts: dict[str, float] = {}
        for rank in (0, 1):
            record = job[rank]
            before = 0.0 if first else jobs[i - 1][rank]["cpu_reported"]
            parts[f"rank {rank} until training"] = record["cpu_train_start"] - before
            parts[f"rank {rank} training"] = record["cpu_reported"] - record["cpu_train_start"]
            parts[f"rank {rank} after training"] = (
                record["cpu_exiting"] - record["cpu_reported"] if last else 0.0
            )
        parts[site.tree_part] = tree_cpu / len(jobs)
        cpu.append(parts)
    return phases, cpu


def _trial_report(trial: Any) -> str:
    """A failed trial's error and the end of its log, for the exception message."""
    log = Path(trial.log_path) if trial.log_path else None
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else "(no log)"
    return f"trial {trial.id}: {trial.state.value} exit {trial.exit_code}: {trial.error}\n{tail}"


def _phases(
    since: float, until: float, record: dict[str, Any], *, launched: float | None = None
) -> dict[str, float]:
    """One job's time from ``since`` (its launch, or the previous reap) to ``until``.

    ``launched``: when the driver launched it (its run's ``started_at``), if not at ``since``.
    """
    launch = since if launched is None else max(since, min(launched, record["torchrun_start"]))
    return {
        "driver: reap -> launch": launch - since,
        "launch -> torchrun starts": record["torchrun_start"] - launch,
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


@contextlib.contextmanager
def open_site(executor: str) -> Iterator[Site]:
    """The site of ``--executor``; for ``slurm`` the test cluster, stopped on the way out."""
    if executor == "local":
        yield local_site()
        return
    if executor == "ray":
        with (
            scratch_folder("launch-overhead-cluster-", keep=False) as folder,
            ray_test_site(folder / "cluster.yaml") as site,
        ):
            yield site
        return
    if executor == "sbatch":
        with (
            slurm_test_site(allocate=False) as test_site,
            scratch_folder("launch-overhead-cluster-", keep=False) as folder,
        ):
            print(f"sbatch: partition debug, PostgreSQL {test_site.postgres.url}", flush=True)
            yield sbatch_site(test_site, folder / "cluster.yaml")
        return
    with slurm_test_site() as test_site:
        print(
            f"slurm: allocation {test_site.job_id} of {test_site.env['SLURM_JOB_NODELIST']} "
            f"({test_site.env['SLURM_JOB_CPUS_PER_NODE']} CPUs), "
            f"PostgreSQL {test_site.postgres.url}",
            flush=True,
        )
        yield slurm_site(test_site)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--executor",
        choices=("local", "slurm", "sbatch", "ray"),
        default="local",
        help="where the jobs run: this machine (default), job steps of an allocation "
        "on the Slurm test cluster (slurm), or one Slurm job per trial there (sbatch), "
        "or the Ray test cluster (ray: also warm and Ray Tune with Ray Train); "
        "the cluster is started and stopped here (root only)",
    )
    parser.add_argument(
        "-k", type=int, default=None, help="trials per kind and round (default 5; 10 with --warm)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, order alternating (2)")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="also run a third kind: the same search with warm workers "
        "(resources.reuse_workers: true); changes the last line",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up job")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    # On Ray the last line names bare, cold, warm and Ray Tune: all four run.
    args.warm = args.warm or args.executor == "ray"
    if args.k is None:
        args.k = WARM_DEFAULT_K if args.warm else COLD_DEFAULT_K
    if args.k < 1 or args.rounds < 1:
        parser.error("-k and --rounds must be positive integers")
    if args.warm and args.executor == "sbatch":
        parser.error(
            "--warm: warm workers need trials placed by slotsweep (local, or --executor "
            "slurm inside an allocation); the sbatch executor submits each trial as a job"
        )

    kinds: tuple[str, ...] = ("bare", "slotsweep", "warm") if args.warm else ("bare", "slotsweep")
    if args.executor == "ray":
        kinds += ("tune",)
    results = {kind: KindResult() for kind in kinds}
    with (
        open_site(args.executor) as site,
        scratch_folder("launch-overhead-", keep=args.keep) as root,
    ):
        if not args.no_warmup:
            warmup = root / "warmup"
            prepare(warmup)
            run_bare(1, warmup, KindResult(), site)
        for r in range(args.rounds):
            order = kinds if r % 2 == 0 else tuple(reversed(kinds))
            for kind in order:
                folder = root / f"round-{r}-{kind}"
                prepare(folder)
                began = time.time()
                result = results[kind]
                if kind == "bare":
                    run_bare(args.k, folder, result, site)
                elif kind == "tune":
                    run_tune(args.k, folder, result, site)
                else:
                    run_slotsweep(args.k, folder, result, site, warm=kind == "warm")
                got = result.per_trial[-args.k :]
                jobs = f", {result.jobs[-1]} torchrun job(s)" if kind == "warm" else ""
                print(
                    f"round {r} {kind:9s}: {args.k} trials{jobs}, per trial "
                    f"{fmt(sum(got) / len(got))} s (took {fmt(time.time() - began, 1)} s)",
                    flush=True,
                )
    report(results, site, k=args.k, rounds=args.rounds)


def report(results: dict[str, KindResult], site: Site, *, k: int, rounds: int) -> None:
    """The summary and tables; the last line depends on whether a warm kind ran."""
    bare, sweep = results["bare"], results["slotsweep"]
    warm = results.get("warm")
    cold_name = "slotsweep cold" if warm else "slotsweep (DB span)"
    print(
        f"\n{k * rounds} trials of each kind ({rounds} rounds of K={k}), executor {site.executor}"
    )
    bare_name = {"local": "bare torchrun", "ray": "bare torchrun on a node"}.get(
        site.executor, "bare srun torchrun"
    )
    shown = [(bare_name, bare), (cold_name, sweep)]
    if warm is not None:
        shown.append(("slotsweep warm", warm))
    for name, measured in shown:
        print(
            f"{name:20s} per trial: mean {fmt(measured.mean)} s, median "
            f"{fmt(median(measured.per_trial))} s, min {fmt(min(measured.per_trial))} s, "
            f"max {fmt(max(measured.per_trial))} s"
        )
    for name, measured in shown[1:]:
        prefix = "" if warm is None else f"{name.split()[-1]}: "
        print(
            f"{prefix}median ratio {fmt(median(measured.per_trial) / median(bare.per_trial))}, "
            f"median overhead {fmt(median(measured.per_trial) - median(bare.per_trial))} s"
        )
    for name, measured in shown[1:]:
        label = "slotsweep" if warm is None else name
        print(
            f"{label} per trial, whole search ((wall - start-up before launch) / K): "
            f"{fmt(sum(measured.whole_search) / len(measured.whole_search))} s"
        )
        print(
            f"{label} one-time costs per search: start-up before the first torchrun "
            f"{fmt(sum(measured.startup) / len(measured.startup))} s, after the last reap "
            f"{fmt(sum(measured.shutdown) / len(measured.shutdown))} s"
        )
    if warm is not None:
        _report_warm_trials(warm, k)

    for title, names, table in (
        ("mean wall phase (s)", PHASES, "phases"),
        ("mean CPU per trial (s)", site.cpu_parts, "cpu"),
    ):
        b_means = _means(getattr(bare, table), names)
        s_means = _means(getattr(sweep, table), names)
        if warm is None:
            print(f"\n{title:28s} {'bare':>8s} {'slotsweep':>10s} {'extra':>8s}")
            for name in names:
                b, s = b_means[name], s_means[name]
                print(f"{name:28s} {fmt(b):>8s} {fmt(s):>10s} {fmt(s - b):>8s}")
            b_total, s_total = sum(b_means.values()), sum(s_means.values())
            print(
                f"{'total':28s} {fmt(b_total):>8s} {fmt(s_total):>10s} "
                f"{fmt(s_total - b_total):>8s}"
            )
            continue
        # The warm kind's wall phases differ (see the warm table): CPU only here.
        columns = [b_means, s_means]
        heads = ["bare", "cold", "cold-bare"]
        if table == "cpu":
            columns.append(_means(warm.cpu, names))
            heads += ["warm", "warm-bare"]
        print(f"\n{title:28s} " + " ".join(f"{h:>9s}" for h in heads))
        for name in (*names, "total"):
            b, *others = (sum(m.values()) if name == "total" else m[name] for m in columns)
            cells = [b]
            for other in others:
                cells += [other, other - b]
            print(f"{name:28s} " + " ".join(f"{fmt(v):>9s}" for v in cells))
    if warm is not None:
        print(
            "(warm CPU: a later trial's 'until training' runs from the previous trial's "
            "report on the same ranks; 'after training' is the job's end, on its last trial)"
        )

    a, b = bare.mean, sweep.mean
    tune = results.get("tune")
    if tune is not None and warm is not None:
        c, w = tune.mean, warm.mean
        print(
            f"ray tune (TorchTrainer) per trial: mean {fmt(c)} s (Tuner.fit / K), "
            f"ray.init {fmt(sum(tune.startup) / len(tune.startup))} s per run"
        )
        print(
            f"bare_s={fmt(a)} slotsweep_ray_s={fmt(b)} slotsweep_ray_warm_s={fmt(w)} "
            f"ray_tune_s={fmt(c)} ratio_vs_bare={fmt(b / a)} ratio_vs_tune={fmt(b / c)}"
        )
        return
    if warm is None:
        print(f"bare_s={fmt(a)} slotsweep_s={fmt(b)} ratio={fmt(b / a)} overhead_s={fmt(b - a)}")
    else:
        c = warm.mean
        print(f"bare_s={fmt(a)} cold_s={fmt(b)} warm_s={fmt(c)} warm_ratio={fmt(c / a)}")


def _report_warm_trials(warm: KindResult, k: int) -> None:
    """The warm kind's trials split by whether they started their job, and their phases."""
    first = [t for t, f in zip(warm.per_trial, warm.first_of_job, strict=True) if f]
    later = [t for t, f in zip(warm.per_trial, warm.first_of_job, strict=True) if not f]
    print(
        f"slotsweep warm: {len(warm.per_trial)} trials on {sum(warm.jobs)} torchrun job(s); "
        f"a job's first trial (cold start) mean {fmt(sum(first) / len(first))} s"
        + (
            f", later trials (handed over) mean {fmt(sum(later) / len(later))} s, "
            f"median {fmt(median(later))} s"
            if later
            else ", no later trials"
        )
    )
    print(
        f"(the warm headline is the DB span / K, so each search's first trial, which "
        f"starts torchrun, is shared over K={k}: it falls towards the later trials' cost "
        f"as K grows)"
    )
    groups = [
        ("first of job", [p for p, f in zip(warm.phases, warm.first_of_job, strict=True) if f]),
        ("later", [p for p, f in zip(warm.phases, warm.first_of_job, strict=True) if not f]),
    ]
    print(f"\n{'warm mean wall phase (s)':36s} {'first of job':>12s} {'later':>10s} {'all':>10s}")
    n = len(warm.phases)
    for name in (*WARM_PHASES, "total"):
        cells = []
        for _, rows in groups:
            values = [
                sum(r.values()) if name == "total" else r[name]
                for r in rows
                if name == "total" or name in r
            ]
            cells.append(fmt(sum(values) / len(values)) if values else "n/a")
        # "all": per trial over all K, a phase a trial lacks counting 0 (sums to the mean).
        total = sum(sum(r.values()) if name == "total" else r.get(name, 0.0) for r in warm.phases)
        cells.append(fmt(total / n))
        print(f"{name:36s} {cells[0]:>12s} {cells[1]:>10s} {cells[2]:>10s}")


if __name__ == "__main__":
    main()
