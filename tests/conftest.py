"""Fixtures shared by every test package.

Slow tests (real torchrun jobs, servers, browsers) carry ``@pytest.mark.slow``;
``pytest -m 'not slow'`` is the quick subset.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
from hypothesis import settings

from trials.timings import TIMINGS_ENV_VAR

if TYPE_CHECKING:
    from tests.real_search import RealSearch

# Every run of the suite replays the same generated examples: a failure in CI is then a
# defect to fix, never a draw of luck. HYPOTHESIS_PROFILE=explore draws new ones (to hunt).
settings.register_profile("replay", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replay"))

# Every driver, UI and trial a test starts inherits these clocks (trials/timings.py): a
# killed driver is noticed, and its leases run out, in seconds rather than the half
# minute a real cluster is given, so tests wait for the event instead of the default.
os.environ.setdefault(TIMINGS_ENV_VAR, "heartbeat_every_s=1,lease_s=8,driver_stale_after_s=6")

# slurm_cluster, slurm_postgres, ray_cluster, ray_postgres fixtures; the gpu marker's skips.
pytest_plugins = ["tests.slurm_cluster", "tests.ray_cluster", "tests.gpu"]

# With pytest-xdist (`.ci/test` runs `--dist loadgroup`), the tests that share one of these
# costly session fixtures go to one worker, so each is built once per run (a Slurm
# or Ray cluster in network namespaces, a real search); every other test goes wherever a
# worker is free.
_SHARED_SESSION_FIXTURES = {
    "slurm_cluster": "slurm",
    "slurm_postgres": "slurm",
    "ray_cluster": "ray",
    "ray_postgres": "ray",
    "real_search": "real-search",
    "failed_search": "real-search",
    "grouping_probe": "grouping-check",
}


@pytest.fixture
def grouping_probe() -> None:
    """Nothing: a test using it is grouped as the costly fixtures' tests are
    (tests/test_xdist_groups.py checks that the grouping reaches pytest-xdist)."""


def shared_fixture_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses one of the costly session fixtures, or None."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if "ray" in getattr(getattr(item, "callspec", None), "params", {}).values():
        # A test parametrized on the Ray executor asks for the Ray cluster at run time.
        fixtures.add("ray_cluster")
    return next(
        (group for name, group in _SHARED_SESSION_FIXTURES.items() if name in fixtures), None
    )


# A test that needs one of these servers is slow (pyproject.toml's marker: it starts real
# processes), marked or not; tests that ask for one by name inside mark that
# parameter themselves (:data:`POSTGRESQL`).
_SERVER_FIXTURES = frozenset({"postgres_server", "s3_server"})
#: The parameter of a test run on SQLite and on PostgreSQL that names the latter.
POSTGRESQL = pytest.param("postgresql", marks=pytest.mark.slow)


# First: pytest-xdist reads the marks in its own hook of this name (and appends the group
# to the node id there); a mark added after it has run is silently ignored, and every
# worker then builds its own clusters.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        group = shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # Slow tests first (in their order otherwise): a worker that is free takes the next
    # test in this order, so the minute-long ones start early and the run ends on
    # second-long ones that fill every worker, not on one long test started last.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# What a group's session fixtures hold (a Ray cluster's daemons use about a sixth of a
# core while idle) is released right after the group's last test, not when the worker's
# session ends minutes later: the rest of the run gets that CPU.
_GROUP_RELEASES: dict[str, list[Callable[[], None]]] = defaultdict(list)


#: Set (``true`` or ``1``) by CI services: the machine is set up to run every test.
CI_ENV_VAR = "CI"


def cannot_run_here(missing: str) -> NoReturn:
    """Skip a test this machine cannot run, saying what is ``missing`` (root, a mount, a
    package); under ``CI=true``, fail with it instead.

    A CI machine is set up to run the whole suite: there, a silent skip would hide a
    part of the suite that no longer runs (a runner that lost root, a mount refused).
    Every test that needs root, a mount or an optional package says so through here.
    """
    if os.environ.get(CI_ENV_VAR, "").strip().lower() in ("true", "1"):
        pytest.fail(f"{CI_ENV_VAR}=true, yet this test cannot run here: {missing}", pytrace=False)
    pytest.skip(missing)


def released_after_group(group: str, release: Callable[[], None]) -> Callable[[], None]:
    """``release``, run at most once: by the caller (a fixture's finalizer) or right
    after the last test of ``group`` in this process (:func:`group_ended`)."""
    done = False

    def once() -> None:
        nonlocal done
        if not done:
            done = True
            release()

    _GROUP_RELEASES[group].append(once)
    return once


def group_ended(item: pytest.Item, nextitem: pytest.Item | None) -> str | None:
    """The group whose last test in this process is ``item``, or None.

    On a ``--dist loadgroup`` worker a group's tests arrive together and run one after
    the other, so the next test tells; elsewhere (no xdist) the tests left in the
    session's order do.
    """
    group = shared_fixture_group(item)
    if group is None or (nextitem is not None and shared_fixture_group(nextitem) == group):
        return None
    if getattr(item.config.option, "loadgroup", False):
        return group
    items = item.session.items
    position = next(i for i, candidate in enumerate(items) if candidate is item)
    later = items[position + 1 :]
    return None if any(shared_fixture_group(i) == group for i in later) else group


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    group = group_ended(item, nextitem)
    if group is not None:
        # The last registered first, as pytest finalizes fixtures (a cluster's database
        # server before the cluster).
        for release in reversed(_GROUP_RELEASES.pop(group, [])):
            release()


@pytest.fixture(autouse=True)
def _signal_dispositions_restored() -> Iterator[None]:
    """Give every test the SIGTERM and SIGINT handling it started with back.

    A test that runs a rank's code in the main thread (a failing trial ignores SIGTERM
    while it records why) would otherwise leave SIGTERM ignored in this process, and
    every process a later test starts would inherit that: in a full run the UI launch
    tests then waited out their 60 s stop timeout, each.
    """
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """SIGKILL what a slow test left running in its temporary folder once it ends.

    A test that fails half-way leaves its drivers, ``torchrun``s and ranks behind (they
    run in sessions of their own); with several xdist workers on two cores they would
    slow every later test into a flake. Each of them works in the test's folder.
    """
    if request.node.get_closest_marker("slow") is None or "tmp_path" not in request.fixturenames:
        yield
        return
    import psutil

    # Asked for here, tmp_path is set up before this fixture and so torn down after it.
    root = str(request.getfixturevalue("tmp_path"))
    yield
    for process in psutil.process_iter():
        try:
            cwd = process.cwd()
            if process.pid != os.getpid() and (cwd == root or cwd.startswith(root + os.sep)):
                process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = REPO_ROOT / "examples"
POSTGRES_SCRIPT = REPO_ROOT / ".ci" / "postgres.sh"
S3_SCRIPT = REPO_ROOT / ".ci" / "s3.sh"
# The S3 server's credentials: never expected in a log, a page, a command line or a row.
S3_SECRET = "s3cr3t-0f-the-t3st-bucket"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def real_search(tmp_path_factory: pytest.TempPathFactory) -> RealSearch:
    """A real small search run through ``slotsweep run`` (see :mod:`tests.real_search`),
    once per session: the UI's pages and the CLI's end-to-end test look at it.

    Read-only use: ``url`` is the finished search, ``running_url`` a copy taken while
    ``running_trial_id`` held its slots with nothing recorded yet.
    """
    from tests.real_search import run_real_search

    return run_real_search(tmp_path_factory.mktemp("real_search"))


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to the newest schema, once per worker: :func:`db_url`
    copies it. Running the migrations for every test took about a tenth of the quick
    subset (each new database runs every Alembic revision; the migrations' own tests
    still do)."""
    from storage import upgrade_schema

    path = tmp_path_factory.mktemp("migrated") / "slotsweep.db"
    upgrade_schema(f"sqlite:///{path}")
    return path


@pytest.fixture
def db_url(tmp_path: Path, migrated_database: Path) -> str:
    """A fresh SQLite database file, migrated to the newest schema."""
    from storage import upgrade_schema

    path = tmp_path / "slotsweep.db"
    source, copy = sqlite3.connect(migrated_database), sqlite3.connect(path)
    try:
        source.backup(copy)  # SQLite's own copy: consistent whatever its WAL holds
    finally:
        copy.close()
        source.close()
    url = f"sqlite:///{path}"
    upgrade_schema(url)  # Finds it at the newest revision: a check, no migration.
    return url


@pytest.fixture
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run the test with the temporary folder as the working directory."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running the ``slotsweep`` CLI as a subprocess."""
    return cli_environment()


def cli_environment() -> dict[str, str]:
    """:func:`cli_env` as a plain function, for session-scoped fixtures."""
    env = dict(os.environ)
    env.pop("SLOTSWEEP_DB", None)
    env.pop("SLOTSWEEP_CLUSTER", None)
    env["PYTHONUNBUFFERED"] = "1"
    # The venv's bin holds torchrun and slotsweep; tests may run from another shell.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def add_experiment(
    url: str,
    trials: Sequence[Mapping[str, Any]] = ({},),
    *,
    name: str = "e",
    state: Any = None,
) -> tuple[int, list[int]]:
    """An experiment row with one trial row per mapping; (experiment id, trial ids).

    Each mapping overrides :class:`storage.Trial` fields; by default a trial is RUNNING
    on one slot with no hyperparameters, and numbered in order. The experiment is ACTIVE
    unless ``state`` says otherwise, with a study name unique to this call.
    """
    from storage import Experiment, ExperimentState, Trial, TrialState, session_scope

    with session_scope(url) as session:
        experiment = Experiment(
            name=name,
            study_name=f"study-{name}-{uuid.uuid4().hex}",
            state=state or ExperimentState.ACTIVE,
            config={},
            model_dir=".",
            max_trials=len(trials),
        )
        session.add(experiment)
        session.flush()
        rows = [
            Trial(
                **{
                    "experiment_id": experiment.id,
                    "optuna_trial_id": number,
                    "optuna_trial_number": number,
                    "state": TrialState.RUNNING,
                    "hparams": {},
                    "slots_per_trial": 1,
                    **fields,
                }
            )
            for number, fields in enumerate(trials)
        ]
        session.add_all(rows)
        session.flush()
        return experiment.id, [row.id for row in rows]


def checkpoint_folder(url: str, experiment_id: int) -> str:
    """The experiment's folder under ``checkpoint_storage.path``, as its row names it."""
    from storage import Experiment, session_scope

    with session_scope(url) as session:
        return session.get_one(Experiment, experiment_id).checkpoint_folder


class PostgresServer:
    """A throw-away PostgreSQL server that a test can stop and start again."""

    def __init__(self, listen_address: str | None = None) -> None:
        """``listen_address`` ("ADDR/PREFIX"): listen on ADDR too, trust its subnet, and
        put ADDR in ``url`` (for clients in network namespaces, e.g. Slurm test nodes)."""
        self.folder = Path(tempfile.mkdtemp(prefix="slotsweep-pg-"))
        self.port = free_port()
        self.listen_address = listen_address
        host = listen_address.split("/")[0] if listen_address else "127.0.0.1"
        self.url = f"postgresql://slotsweep@{host}:{self.port}/slotsweep"

    def _script(self, *args: str) -> None:
        done = subprocess.run(
            ["bash", str(POSTGRES_SCRIPT), *args], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            pytest.fail(f"postgres.sh {args[0]} failed: {done.stderr[-2000:]}")

    def start(self) -> None:
        extra = [self.listen_address] if self.listen_address else []
        self._script("start", str(self.folder), str(self.port), *extra)

    def stop(self) -> None:
        """Fast shutdown: open connections are terminated, new ones refused."""
        self._script("stop", str(self.folder))

    def restart(self) -> None:
        """Start the stopped server again with the options it last ran with."""
        self._script("restart", str(self.folder))

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """``postgresql://`` URL of one server on 127.0.0.1 for the whole session, stopped by PID."""
    folder = Path(tempfile.mkdtemp(prefix="slotsweep-pg-"))
    port = free_port()
    started = subprocess.run(
        ["bash", str(POSTGRES_SCRIPT), "start", str(folder), str(port)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if started.returncode != 0:
        pytest.fail(f"PostgreSQL did not start: {started.stderr[-2000:]}")
    try:
        yield f"postgresql://slotsweep@127.0.0.1:{port}/slotsweep"
    finally:
        subprocess.run(
            ["bash", str(POSTGRES_SCRIPT), "stop", str(folder)], check=False, timeout=60
        )
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL of one moto S3 server on 127.0.0.1 for the session, stopped by PID."""
    folder = Path(tempfile.mkdtemp(prefix="slotsweep-s3-"))
    port = free_port()
    started = subprocess.run(
        ["bash", str(S3_SCRIPT), "start", str(folder), str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if started.returncode != 0:
        pytest.fail(f"the S3 server did not start: {started.stderr[-2000:]}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(S3_SCRIPT), "stop", str(folder)], check=False, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def point_s3_at(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Put the test credentials and ``endpoint`` in this process's environment; the
    environment (for ``yield from`` in a fixture).

    That is the usual place, which the trials' processes inherit, and nowhere else.
    fsspec keeps one S3 filesystem per set of arguments while the endpoint comes from
    the environment: the cached one is dropped on entry and on exit, so no test talks to
    another test's server (the Slurm bridge's, say) on the same worker.
    """
    import s3fs

    env = {
        "AWS_ACCESS_KEY_ID": "slotsweep-test-key",
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield env
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://<bucket>``: a fresh bucket of this test's own on the session's server,
    with the credentials and the endpoint in the environment (:func:`point_s3_at`)."""
    import boto3

    for _ in point_s3_at(s3_server, monkeypatch):
        bucket = f"test-{uuid.uuid4().hex[:16]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        yield f"s3://{bucket}"


def bridge_bucket(
    address: str, bucket: str, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on an S3 server of its own (moto's, ``.ci/s3.sh``) listening on
    ``address``, a test cluster's bridge address, which its nodes reach; its URL and the
    credentials' environment (also set in this process, :func:`point_s3_at`).

    For ``yield from`` in a fixture; the server (its files in ``folder``) is stopped
    after.
    """
    import boto3

    port = free_port()
    subprocess.run(
        ["bash", str(S3_SCRIPT), "start", str(folder), str(port), address],
        check=True,
        capture_output=True,
        timeout=120,
        env={**cli_environment(), "PYTHON": sys.executable},
    )
    try:
        for env in point_s3_at(f"http://{address}:{port}", monkeypatch):
            boto3.client("s3").create_bucket(Bucket=bucket)
            yield f"s3://{bucket}", env
    finally:
        subprocess.run(["bash", str(S3_SCRIPT), "stop", str(folder)], check=False, timeout=60)


def fresh_database(server_url: str) -> Iterator[str]:
    """A database of its own on the server at ``server_url`` (its URL), dropped after.

    For ``yield from`` in a fixture: nothing another test left (a killed driver's queued
    trials, say) is in it, and a connection still open to it at the end is closed.
    """
    import sqlalchemy as sa

    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(
        server_url.replace("postgresql://", "postgresql+psycopg://", 1),
        isolation_level="AUTOCOMMIT",
    )
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield f"{server_url.rsplit('/', 1)[0]}/{name}"
        with admin.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A database of this test's own on the session's server."""
    yield from fresh_database(postgres_server)


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, to stop and restart (the shared one must not be)."""
    if os.geteuid() != 0:
        cannot_run_here("restarting PostgreSQL as its own user needs root")
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()
