"""What every part of the search driver reads: one experiment's fixed facts and timings.

:class:`~searcher.driver.SearchDriver` builds one :class:`DriverContext` when it starts
and hands it to its parts (:mod:`searcher.study_side`, :mod:`searcher.placement`,
:mod:`searcher.running`, :mod:`searcher.outcomes`, :mod:`searcher.control`). Nothing
in it changes while the driver runs; what does change (the Optuna study, the pending
queue, the running attempts, what Ctrl-C asked for) lives in the part that owns it.

Example:
    >>> ctx = DriverContext(  # doctest: +SKIP
    ...     db_url=url, experiment_id=3, study_name="slotsweep-3", model_dir=Path("."),
    ...     config=config, pool=pool, executor=executor, run_dir=Path("logs/experiment-3"),
    ...     timings=Timings(heartbeat_every_s=2.0, lease_s=30.0, preempt_grace_s=120.0,
    ...                     startup_allowance_s=120.0, kill_grace_s=10.0),
    ... )
    >>> ctx.label(4)  # doctest: +SKIP
    '3.4'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from searcher.config import ExperimentConfig
from trials.executors import Executor
from trials.labels import trial_label
from trials.scheduler import ResourcePool

# Every part logs as the driver did before it was split, so a filter on the
# "searcher.driver" logger still sees every line the driver writes.
driver_log = logging.getLogger("searcher.driver")


@dataclass(frozen=True)
class Timings:
    """The driver's clocks, in seconds (``searcher.driver`` holds their values).

    They are read when a :class:`~searcher.driver.SearchDriver` is made, so a test that
    patches ``searcher.driver.LEASE_S`` (or another) before making one is obeyed. A
    driver started as a process (``slotsweep run``) takes its lease from the
    ``SLOTSWEEP_LEASE_S`` environment variable when it is set (its heartbeat then comes
    at least four times per lease): the tests and the soak that stop a driver for
    longer than its lease use it.
    """

    #: How often the driver writes its heartbeat and looks for hung trials.
    heartbeat_every_s: float
    #: How long a slot claim holds without being renewed by a heartbeat.
    lease_s: float
    #: How long a preempted trial may take to checkpoint and exit before it is killed.
    preempt_grace_s: float
    #: The least time a run gets before its first record (start-up is no hang).
    startup_allowance_s: float
    #: How long a killed trial gets after SIGTERM (rank 0 commits what it queued).
    kill_grace_s: float


@dataclass(frozen=True)
class DriverContext:
    """One experiment as its driver sees it: where it is stored, what it runs, where.

    Shared read-only by the driver's parts, so none of them needs the driver itself.
    """

    db_url: str
    experiment_id: int
    study_name: str
    model_dir: Path
    config: ExperimentConfig
    pool: ResourcePool
    executor: Executor
    #: Where the trials' logs go (``<SLOTSWEEP_LOG_DIR>/experiment-<id>``).
    run_dir: Path
    timings: Timings

    def label(self, number: int) -> str:
        """The trial's name in messages (``<experiment>.<optuna number>``).

        Example:
            >>> ctx.label(0)  # doctest: +SKIP
            '3.0'
        """
        return trial_label(self.experiment_id, number)
