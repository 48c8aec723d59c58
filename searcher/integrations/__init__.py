"""Where a search shows up besides slotsweep: TensorBoard, MLflow and webhooks.

Everything here reads the database and writes to another tool, never the other way,
and never from a rank: a tool that is slow or down cannot slow or fail training.

- :mod:`~searcher.integrations.records`: what the exporters read of an experiment;
- :mod:`~searcher.integrations.tensorboard_events`: event files, appended to
  (``slotsweep tensorboard``);
- :mod:`~searcher.integrations.mlflow_runs`: MLflow runs nested under the search's
  (``integrations.mlflow``, ``slotsweep export mlflow``);
- :mod:`~searcher.integrations.notifications`: webhook bodies and their delivery;
- :mod:`~searcher.integrations.driver_side`: the driver's background thread for both;
- :mod:`~searcher.integrations.extras`: the optional packages, named when missing.

May import the package's own modules (:mod:`searcher.experiments`), ``storage`` and
``trials``; submission, the driver and the CLI import this package, never the reverse. TensorBoard and MLflow load on first use.

Example:
    >>> from searcher.integrations import missing_extra_message
    >>> missing_extra_message("mlflow", "mlflow")
    "mlflow is not installed: pip install 'slotsweep[mlflow]'"
"""

from __future__ import annotations

from searcher.integrations.driver_side import CLOSE_TIMEOUT_S, DriverIntegrations
from searcher.integrations.extras import (
    ensure_installed,
    integration_problem,
    missing_extra_message,
    require,
)
from searcher.integrations.mlflow_runs import MlflowExport, search_key
from searcher.integrations.notifications import Poster, notification_body, payload_for
from searcher.integrations.records import ExperimentRecord, TrialRecord, read_experiment
from searcher.integrations.tensorboard_events import TensorBoardExport, run_name

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DriverIntegrations",
    "ExperimentRecord",
    "MlflowExport",
    "Poster",
    "TensorBoardExport",
    "TrialRecord",
    "ensure_installed",
    "integration_problem",
    "missing_extra_message",
    "notification_body",
    "payload_for",
    "read_experiment",
    "require",
    "run_name",
    "search_key",
]
