"""A run validated once, before anything is written: what the driver is handed.

``slotsweep run``, ``resume`` and ``continue`` (and ``run --test``) each build one
:class:`ValidatedRun`, and :class:`~searcher.driver.driver.SearchDriver` takes it as it is:
the typed config, the cluster, the one executor object of the run, the database URL
and the schedulability verdict. Every check lives here, once:

- the config (parsed by :mod:`trials.config`) and, for a new run, its entrypoint
  (:func:`searcher.submit.preflight.check_entrypoint`); for a stored run, that the folders it
  stores exist, or where they moved (:mod:`searcher.submit.relocation`);
- the database: its URL, whether it opens, and whether the executor's nodes can share it
  (:func:`trials.executors.database_problem`);
- schedulability: every ``slots_per_trial`` a trial may ask for fits the pool
  (:func:`trials.scheduler.check_schedulable`), or with ``resources.shrink_to_fit`` the
  largest size that does replaces it (:func:`trials.scheduler.largest_fit`; the run's
  :attr:`ValidatedRun.notes` say so);
- the executor's objections to the config (:func:`executor_problem`) and to the pool's
  agents (:func:`trials.executors.reach_problem`: an agent on another host with the
  local executor).

A refusal raises an exception the CLI prints as one line per problem with exit code 2
(:class:`~searcher.experiments.UsageError`, :class:`~trials.config.ConfigError`,
:class:`~trials.scheduler.ClusterConfigError` and the scheduler's
:class:`~trials.scheduler.Unschedulable`); nothing is written before every check passed:
a new run's SQLite file is created by the last check, which opens it.

Example:
    >>> from trials.executors import LocalExecutor, parse_cluster
    >>> cluster = parse_cluster({"resource_pools": [{"name": "default",
    ...     "agents": [{"name": "a1", "slots": 2}]}]})
    >>> run = validate_run(config, cluster, "sqlite:////tmp/search.db")
    >>> run.pool.name, run.slots_per_trial, isinstance(run.executor, LocalExecutor)
    ('default', (2,), True)
    >>> away = parse_cluster({"resource_pools": [{"name": "default",
    ...     "agents": [{"name": "a1", "host": "gpu-7", "slots": 2}]}]})
    >>> validate_run(config, away, "sqlite:////tmp/search.db")
    Traceback (most recent call last):
    ...
    searcher.experiments.UsageError: cluster: agent 'a1' of resource pool 'default' is on host 'gpu-7'; the local executor starts trials on this machine only (its agents' host: localhost, 127.0.0.1 or this machine's name); run slotsweep on that host, or use executor: slurm or executor: ray
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from searcher.experiments import UsageError, find_experiment
from searcher.integrations import integration_problem
from searcher.submit.preflight import check_entrypoint
from searcher.submit.relocation import NO_RELOCATION, Relocation, missing_folder
from storage import (
    DB_ENV_VAR,
    absolute_db_url,
    check_database_url,
    get_engine,
    redact_secrets,
    redact_url,
    resolve_db_url,
    session_scope,
    upgrade_schema,
)
from trials.config import (
    ConfigError,
    ExperimentConfig,
    load_config,
    parse_config,
    read_stored_config,
)
from trials.executors import (
    Executor,
    database_problem,
    executor_for,
    load_cluster,
    reach_problem,
)
from trials.scheduler import (
    Cluster,
    ResourcePool,
    UnknownPool,
    check_schedulable,
    largest_fit,
)

__all__ = [
    "ValidatedRun",
    "executor_problem",
    "open_database",
    "validate_new_run",
    "validate_run",
    "validate_stored_run",
]


@dataclass(frozen=True)
class ValidatedRun:
    """A run every check has passed: what it runs, where, through which executor, recorded where.

    Built only by this module's functions; the driver trusts it and checks nothing again.
    """

    config: ExperimentConfig
    cluster: Cluster
    #: The config's resource pool in :attr:`cluster`.
    pool: ResourcePool
    #: The run's one executor: the driver launches and ends every attempt through it.
    executor: Executor
    #: Absolute (a relative SQLite path means the submitting shell's folder).
    db_url: str
    #: The schedulability verdict: every ``slots_per_trial`` a trial may ask for, each
    #: of which the pool can run.
    slots_per_trial: tuple[int, ...]
    #: Lines to print when the run starts: what the checks changed (a size shrunk to fit).
    notes: tuple[str, ...] = ()

    def with_config(self, config: ExperimentConfig) -> ValidatedRun:
        """This run with ``config`` (``continue`` raised its trial budget); same resources only.

        Example:
            >>> from trials.executors import parse_cluster
            >>> run = validate_run(config, parse_cluster({"resource_pools": [
            ...     {"name": "default", "agents": [{"name": "a1", "slots": 2}]}]}), "sqlite://")
            >>> run.with_config(config.model_copy(update={"max_restarts": 5})).config.max_restarts
            5
        """
        if config.resources != self.config.resources or config.hyperparameters.get(
            "slots_per_trial"
        ) != self.config.hyperparameters.get("slots_per_trial"):
            raise ValueError("a validated run's resources cannot change; validate again")
        return replace(self, config=config)


def executor_problem(executor: Executor, config: ExperimentConfig) -> str | None:
    """Why ``config`` cannot run on ``executor``, or None.

    Warm workers stay inside our own placement: an executor whose cluster engine places
    each trial as its own job (Slurm with a ``slurm:`` jobs block) ends the job with
    the trial, and holding that job between trials would hide it from Slurm's queue.
    Shares of one slot need an executor that puts processes on the ledger's slots
    itself (:attr:`~trials.executors.Executor.shares_slots`).

    Example:
        >>> from trials.executors import LocalExecutor
        >>> executor_problem(LocalExecutor(), config) is None
        True
    """
    if config.resources.reuse_workers and executor.places_trials:
        return (
            "resources.reuse_workers: not available when the cluster's executor "
            f"({executor.name}) submits each trial as its own job; set it to false, or "
            "run the search inside an allocation"
        )
    if config.resources.slot_share < 1 and not executor.shares_slots:
        return (
            f"resources.slots_per_trial: a share of one slot "
            f"({config.resources.slots_per_trial:g}) needs an executor that starts trials on "
            f"the slot ledger's own slots (local); the cluster's executor ({executor.name}) "
            "gets whole GPUs from its cluster engine: with it, use a whole number of slots "
            "(1, 2, ...)"
        )
    return None


def validate_run(config: ExperimentConfig, cluster: Cluster, db_url: str) -> ValidatedRun:
    """Check ``config`` against ``cluster`` and the executor built for it (the run's one).

    ``db_url`` is taken as given (a temporary database, say): only whether the
    executor's nodes can share it is checked, not whether it opens.
    """
    executor = executor_for(cluster)
    _refuse(database_problem(executor, db_url))
    return _checked(config, cluster, executor, db_url)


def validate_new_run(
    config_source: Path | Mapping[str, Any],
    db: str | None,
    *,
    cluster_file: str | Path | None,
    slots: int | None,
    model_dir: Path | None = None,
) -> ValidatedRun:
    """``slotsweep run CONFIG`` (and :func:`searcher.api.run`): every check, in the order
    a user fixes them.

    ``config_source`` is the YAML file, or a mapping of the same shape whose entrypoint
    is looked up in ``model_dir`` (default: the current folder); a file's model
    directory is its folder. ``db`` is ``--db`` (None: ``$SLOTSWEEP_DB`` or the
    default); ``cluster_file`` and ``slots`` are ``--cluster`` and ``--slots``
    (:func:`trials.executors.load_cluster`). The entrypoint is probed before the
    database is opened, which creates an SQLite file: a typo costs a second here
    instead of every trial's restarts, and leaves no file.
    """
    if isinstance(config_source, Mapping):
        folder = (model_dir or Path.cwd()).resolve()
        config = parse_config(dict(config_source), config_dir=folder)
    else:
        folder = Path(config_source).resolve().parent
        config = load_config(config_source)
    cluster = load_cluster(cluster_file, slots=slots)
    url, source = _database_url(db, need_schema=False)
    run = validate_run(config, cluster, url)
    problems = check_entrypoint(config, folder)
    if problems:
        raise ConfigError(problems)
    _connect(url, source, need_schema=False)
    return run


def validate_stored_run(
    ref: str,
    db: str | None,
    *,
    cluster_file: str | Path | None,
    slots: int | None,
    relocation: Relocation = NO_RELOCATION,
) -> tuple[int, ValidatedRun]:
    """``slotsweep resume|continue EXPERIMENT``: the experiment's id and its run on the cluster.

    The database must already be slotsweep's (nothing is created); the config is the
    one stored with the experiment, read through ``relocation`` (``--relocate``). A
    stored folder the run would write into must exist (:func:`~searcher.submit.relocation.missing_folder`).
    """
    cluster = load_cluster(cluster_file, slots=slots)
    executor = executor_for(cluster)
    # Before the database is opened: opening brings an older schema up to date.
    _refuse(database_problem(executor, resolve_db_url(db)))
    db_url = open_database(db, need_schema=True)
    with session_scope(db_url) as session:
        experiment = find_experiment(session, ref)
        experiment_id = experiment.id
        _refuse(missing_folder(session, experiment, relocation))
        config = relocation.config(read_stored_config(experiment.config))
    return experiment_id, _checked(config, cluster, executor, db_url)


def open_database(db: str | None, *, need_schema: bool = False) -> str:
    """The absolute database URL from ``--db`` (or ``$SLOTSWEEP_DB``), checked and opened.

    ``need_schema``: the command reads or controls existing experiments, so a database
    without slotsweep's tables is refused and nothing is created (no file, no tables);
    one that has them is brought to the newest schema (a search recorded by an older
    version resumes). Without it, opening an SQLite URL creates its file.
    """
    url, source = _database_url(db, need_schema=need_schema)
    _connect(url, source, need_schema=need_schema)
    return url


def _database_url(db: str | None, *, need_schema: bool) -> tuple[str, str]:
    """The absolute URL and the name of where it came from, its shape checked (nothing opened)."""
    url = resolve_db_url(db)
    source = "--db" if db else ("SLOTSWEEP_DB" if os.environ.get(DB_ENV_VAR) else "--db")
    check_database_url(url, source=source, need_schema=need_schema)
    return absolute_db_url(url), source


def _connect(url: str, source: str, *, need_schema: bool) -> None:
    """Open the database once (an SQLite file is created); bring its schema up to date."""
    try:
        with get_engine(url).connect():
            pass
    except DBAPIError as exc:
        reason = str(exc.orig).splitlines()[0] if str(exc.orig).strip() else "connection failed"
        raise UsageError(
            f"{source}: cannot open {redact_url(url)}: {redact_secrets(reason, url)}"
        ) from None
    if need_schema:
        upgrade_schema(url)


def _checked(
    config: ExperimentConfig, cluster: Cluster, executor: Executor, db_url: str
) -> ValidatedRun:
    """The checks of ``config`` on ``cluster`` that read nothing but their arguments."""
    try:
        pool = cluster.pool(config.resources.resource_pool)
    except UnknownPool as exc:
        raise UsageError(f"resources.resource_pool: {exc}") from None
    config, notes = _shrunk_to_fit(config, pool)
    sizes = tuple(config.possible_slots_per_trial())
    for slots in sizes:
        check_schedulable(pool, slots)
    _refuse(executor_problem(executor, config))
    _refuse(reach_problem(executor, pool))
    _refuse(integration_problem(config))
    return ValidatedRun(
        config=config,
        cluster=cluster,
        pool=pool,
        executor=executor,
        db_url=db_url,
        slots_per_trial=sizes,
        notes=notes,
    )


def _shrunk_to_fit(
    config: ExperimentConfig, pool: ResourcePool
) -> tuple[ExperimentConfig, tuple[str, ...]]:
    """``config`` with ``resources.slots_per_trial`` lowered to the largest size the pool
    can run, where ``resources.shrink_to_fit`` asks for it; the line that says so."""
    resources = config.resources
    # A share of one slot fits wherever one slot does: nothing to shrink.
    if not resources.shrink_to_fit or resources.slot_share < 1.0:
        return config, ()
    size = largest_fit(pool, resources.slots)
    if size == resources.slots_per_trial:
        return config, ()
    fitted = resources.model_copy(update={"slots_per_trial": size})
    note = (
        f"resources.slots_per_trial: {resources.slots_per_trial} cannot be placed in resource "
        f"pool {pool.name!r}; shrink_to_fit: each trial runs on {size} slot(s), the most it can"
    )
    return config.model_copy(update={"resources": fitted}), (note,)


def _refuse(problem: str | None) -> None:
    if problem:
        raise UsageError(problem)
