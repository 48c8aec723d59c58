"""What every part of the search driver reads: one experiment's fixed facts and timings.

:class:`~searcher.driver.driver.SearchDriver` builds one :class:`DriverContext` when it starts
and hands it to its parts (:mod:`searcher.driver.study_side`, :mod:`searcher.driver.placement`,
:mod:`searcher.driver.running`, :mod:`searcher.driver.outcomes`, :mod:`searcher.driver.control`). Nothing
in it changes while the driver runs; what does change (the Optuna study, the pending
queue, the running attempts, what Ctrl-C asked for) lives in the part that owns it.

Example:
    >>> from trials.executors import LocalExecutor
    >>> ctx = DriverContext(
    ...     db_url=url, experiment_id=3, study_name="slotsweep-3", model_dir=Path("."),
    ...     config=config, pool=pool, executor=LocalExecutor(), run_dir=Path("logs/experiment-3"),
    ...     timings=Timings(), checkpoint_folder="3-5f0c2a9e41b7",
    ... )
    >>> ctx.label(4)
    '3.4'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trials.config import ExperimentConfig
from trials.executors import Executor
from trials.labels import trial_label
from trials.scheduler import ResourcePool
from trials.timings import Timings

# Every part logs as the driver did before it was split, so a filter on the
# "searcher.driver.driver" logger still sees every line the driver writes.
driver_log = logging.getLogger("searcher.driver")


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
    #: The experiment's folder under ``checkpoint_storage.path``
    #: (:attr:`storage.Experiment.checkpoint_folder`).
    checkpoint_folder: str

    def label(self, number: int) -> str:
        """The trial's name in messages (``<experiment>.<optuna number>``).

        Example:
            >>> ctx.label(0)
            '1.0'
        """
        return trial_label(self.experiment_id, number)
