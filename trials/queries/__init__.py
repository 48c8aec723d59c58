"""The read model: every question the CLI, the Python API and the UI ask of the database.

``slotsweep list``, ``describe``, ``task list`` and ``agents``, the API's
``Experiment.trials()``, ``best_trial``, ``metrics`` and ``checkpoint_path``, and every
page of the UI read through these functions, so one question has one answer: one
count of an experiment's trials, one "best trials", one lookup of a trial by number.
What each reader does with the answer (a rich table, a JSON document, a DataFrame of
the API, a chart) stays with it. By subject:

- experiments with their trial counts and best value (``_experiments``);
- trials with their hyperparameters and searcher metric, the best trials, a trial by
  number (``_trials``);
- metrics by step: a trial's rows and curves, learning curves, best so far (``_metrics``);
- failures: the commonest reason, fail-fast stops, a rank's traceback (``_failures``);
- slot holdings and allocations (``_slots``) and the cluster's queue (``_queue``);
- timings and system metrics (``_timings``); checkpoints and runs (``_checkpoints``);
- stored diagnoses (``_diagnoses``);
- a multi-objective search's Pareto front and where its pruned trials stopped
  (``_pareto``).

Every query takes ``db``, a :data:`Source`: an engine (the query opens a short
connection of its own and closes it before returning, as the UI needs) or the
caller's session or connection (it reads inside that transaction). Small answers are
typed frozen dataclasses (:class:`TrialCounts`, :class:`TrialRow`,
:class:`ExperimentSummary`, ...); tables the UI pages through, up to 10,000 rows, are
DataFrames (pandas loads on first use, so the driver and the CLI never import it).
A stored config is parsed once by whoever holds it and passed on (a direction, a
metric name), or read leniently (:func:`typed_config`) where a list must show what it
can of every experiment.

May import ``storage``, the base modules of ``trials``, :mod:`trials.config`,
:mod:`trials.scheduler` (types), :mod:`trials.coordination` (the slot ledger's
holders, the queue's views) and :mod:`trials.pruning` (fronts, rung decisions); nothing in ``trials`` imports it, and ``searcher`` and
``ui`` read through it. No SQL on Optuna's tables here: those are ``storage``'s.

Example:
    >>> from storage import get_engine
    >>> from trials import queries
    >>> engine = get_engine(url, read_only=True)
    >>> queries.trial_counts(engine, 1).queued, queries.experiment_summary(engine, 1).name
    (1, 'digits-large-batch')
"""

from trials.queries._checkpoints import (
    DamagedCheckpoint,
    checkpoints,
    damaged_checkpoints,
    newest_checkpoint_path,
    newest_checkpoint_steps,
    trial_runs,
)
from trials.queries._diagnoses import diagnosis_choices, diagnosis_report
from trials.queries._experiments import (
    ExperimentOverview,
    ExperimentSummary,
    TrialCounts,
    experiment_choices,
    experiment_overviews,
    experiment_summary,
    has_schema,
    list_experiments,
    metric_name,
    shown_state,
    smaller_is_better,
    trial_counts,
    trial_total,
    typed_config,
)
from trials.queries._failures import (
    FailureSummary,
    RankFailure,
    fail_fast_stop,
    failed_trial_log,
    failure_summary,
    failure_traceback,
    trial_failure,
)
from trials.queries._metrics import (
    LearningCurves,
    best_so_far,
    learning_curves,
    metric_curves,
    metric_names,
    metric_rows,
    trials_metric_curves,
)
from trials.queries._pareto import ParetoSummary, pareto_summary, pruned_stops
from trials.queries._queue import (
    QueuedView,
    queue_views,
    queued_outside_queue,
    queued_trials,
    waited_s,
    waiting_reason,
    waiting_trials,
)
from trials.queries._reading import Page, Source
from trials.queries._slots import (
    SlotHolder,
    SlotsInUse,
    allocation_summary,
    allocations,
    held_slots,
    in_use,
    slot_holders,
    slots_in_use,
)
from trials.queries._timings import (
    system_metric_series,
    system_metric_summary,
    timing_breakdown,
    timing_series,
)
from trials.queries._trials import (
    TRIAL_SORT_COLUMNS,
    TrialRow,
    best_trials,
    experiment_trials,
    latest_trial_id,
    list_trials,
    trial_detail,
    trial_frame,
    trial_id,
    trial_number_range,
    trials_by_ids,
    trials_by_numbers,
)

__all__ = [
    "TRIAL_SORT_COLUMNS",
    "DamagedCheckpoint",
    "ExperimentOverview",
    "ExperimentSummary",
    "FailureSummary",
    "LearningCurves",
    "Page",
    "ParetoSummary",
    "QueuedView",
    "RankFailure",
    "SlotHolder",
    "SlotsInUse",
    "Source",
    "TrialCounts",
    "TrialRow",
    "allocation_summary",
    "allocations",
    "best_so_far",
    "best_trials",
    "checkpoints",
    "damaged_checkpoints",
    "diagnosis_choices",
    "diagnosis_report",
    "experiment_choices",
    "experiment_overviews",
    "experiment_summary",
    "experiment_trials",
    "fail_fast_stop",
    "failed_trial_log",
    "failure_summary",
    "failure_traceback",
    "has_schema",
    "held_slots",
    "in_use",
    "latest_trial_id",
    "learning_curves",
    "list_experiments",
    "list_trials",
    "metric_curves",
    "metric_name",
    "metric_names",
    "metric_rows",
    "newest_checkpoint_path",
    "newest_checkpoint_steps",
    "pareto_summary",
    "pruned_stops",
    "queue_views",
    "queued_outside_queue",
    "queued_trials",
    "shown_state",
    "slot_holders",
    "slots_in_use",
    "smaller_is_better",
    "system_metric_series",
    "system_metric_summary",
    "timing_breakdown",
    "timing_series",
    "trial_counts",
    "trial_detail",
    "trial_failure",
    "trial_frame",
    "trial_id",
    "trial_number_range",
    "trial_runs",
    "trial_total",
    "trials_by_ids",
    "trials_by_numbers",
    "trials_metric_curves",
    "typed_config",
    "waited_s",
    "waiting_reason",
    "waiting_trials",
]
