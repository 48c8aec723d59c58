"""What ``list``, ``describe``, ``task list`` and ``agents`` show: rows, then tables.

Each command gathers plain rows first (dicts of JSON types, full precision: what
``--json`` prints) from the read model's answers (:mod:`trials.queries`, which the API
and the UI read too) and renders the same rows as a rich table for a terminal, so the
two outputs never disagree. Tables take the console's width: short columns never
wrap, hyperparameter lists fold onto more lines, and floats show 4 significant
digits (the JSON keeps every digit).

Example:
    >>> format_value(0.03833332156156663), format_value(12), format_value("adamw")
    ('0.03833', '12', 'adamw')
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from storage import Experiment, TrialState
from trials import queries
from trials.config import format_share, read_stored_config, slot_share_of
from trials.labels import checkpoint_label, trial_label
from trials.numbers import format_hparams, format_value
from trials.pruning import how_far
from trials.queries import (
    SlotsInUse,
    Source,
    damaged_checkpoints,
    experiment_overviews,
    experiment_trials,
    newest_checkpoint_steps,
    queue_views,
    waited_s,
    waiting_reason,
)

if TYPE_CHECKING:
    from trials.queries import QueuedView, SlotHolder, TrialRow
    from trials.scheduler import Cluster

# Columns of ids, states and counts: never wrapped, never cut (the text column folds).
_SHORT: dict[str, Any] = {"no_wrap": True}
_FOLD: dict[str, Any] = {"overflow": "fold", "ratio": 1}


def _table(title: str) -> Table:
    """A table that leaves its width to the data: a rule under the header, no frame,
    one space between columns, so 80 columns hold the counts and still fold text."""
    return Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)


# ----------------------------------------------------------------------- list


def experiment_rows(db: Source) -> list[dict[str, Any]]:
    """One row per experiment, by id: state, trial counts and the best searcher metric value.

    A stored config this version cannot read leaves ``metric`` None (the row's other
    columns are the database's own).
    """
    return [
        {
            "id": overview.id,
            "name": overview.name,
            "state": overview.state,
            "trials": overview.counts.total,
            "max_trials": overview.max_trials,
            "running": overview.counts.running,
            "completed": overview.counts.completed,
            "pruned": overview.counts.pruned,
            "failed": overview.counts.errored,
            "metric": overview.metric,
            "best": overview.best,
        }
        for overview in experiment_overviews(db)
    ]


def experiments_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    table = _table("Experiments")
    table.add_column("id", **_SHORT)
    table.add_column("name", overflow="fold")
    for column in ("state", "trials", "running", "completed", "pruned", "failed", "best"):
        table.add_column(column, **_SHORT)
    for row in rows:
        table.add_row(
            str(row["id"]),
            row["name"],
            row["state"],
            f"{row['trials']}/{row['max_trials']}",
            str(row["running"]),
            str(row["completed"]),
            str(row["pruned"]),
            str(row["failed"]),
            format_value(row["best"]),
        )
    return table


# ------------------------------------------------------------------- describe


def describe_rows(db: Source, experiment: Experiment) -> dict[str, Any]:
    """The experiment and each of its trials, numbered as Optuna numbers them, with its
    newest checkpoint's step and, for a QUEUED trial, why it waits."""
    metric = read_stored_config(experiment.config).searcher.metric
    steps = newest_checkpoint_steps(db, experiment.id)
    damaged = damaged_checkpoints(db, experiment.id)
    queued = {view.trial_id: view for view in queue_views(db, experiment_id=experiment.id)}
    trials = [
        {
            "trial": trial.label,
            "number": trial.number,
            "state": trial.state.value,
            metric: trial.searcher_metric,
            "batches": trial.batches,
            "restarts": trial.restarts,
            "slot_seconds": trial.slot_seconds,
            "checkpoint_step": steps.get(trial.id),
            "hyperparameters": trial.hyperparameters,
            "error": trial.error,
            "waiting_reason": (
                waiting_reason(queued.get(trial.id), experiment.state)
                if trial.state == TrialState.QUEUED
                else None
            ),
            "skipped_checkpoints": [asdict(c) for c in damaged.get(trial.id, [])],
        }
        for trial in experiment_trials(db, experiment.id)
    ]
    return {
        "id": experiment.id,
        "name": experiment.name,
        "state": experiment.state.value,
        "metric": metric,
        "max_trials": experiment.max_trials,
        # Its folder under checkpoint_storage.path: ``<id>-<key>``, not to be guessed.
        "checkpoint_folder": experiment.checkpoint_folder,
        "trials": trials,
    }


def describe_front(db_url: str, experiment: Experiment) -> dict[str, Any]:
    """A multi-objective experiment's Pareto front so far and where its pruned trials stopped.

    ``pareto_front``: the completed trials no other completed trial dominates, with the
    values Optuna was told (the searcher metric, then each cost objective), best metric
    first. ``pruned_at``: each trial the pruner stopped, at its rung: the rung, how far
    the trial had come (``step`` of the pruner's ``unit``, as Optuna counts it) and its
    values there. Both empty
    for a single-objective experiment (:func:`trials.queries.pareto_summary`).
    """
    searcher = read_stored_config(experiment.config).searcher
    summary = queries.pareto_summary(db_url, experiment.study_name, searcher)
    names, unit = summary.objectives, searcher.resource_unit
    return {
        "objectives": names,
        "pareto_front": [
            {
                "trial": trial_label(experiment.id, number),
                "number": number,
                **dict(zip(names, values, strict=True)),
            }
            for number, values in summary.front
        ],
        "pruned_at": [
            {
                "trial": trial_label(experiment.id, stop.trial_number),
                "number": stop.trial_number,
                "rung": stop.rung,
                # In the pruner's unit: Optuna's hundredths of a slot-second, or epochs/batches.
                "step": stop.step,
                "unit": unit,
                **dict(zip(names, stop.values, strict=True)),
            }
            for stop in summary.stops
        ],
    }


def trials_table(described: Mapping[str, Any]) -> Table:
    metric = described["metric"]
    table = _table(f"Experiment {described['id']}: {described['name']} ({described['state']})")
    table.add_column("trial", **_SHORT)
    table.add_column("state", **_SHORT)
    table.add_column(metric, **_SHORT)
    table.add_column("batches", **_SHORT)
    table.add_column("restarts", **_SHORT)
    table.add_column("checkpoint", **_SHORT)
    table.add_column("hyperparameters", **_FOLD)
    for row in described["trials"]:
        step = row["checkpoint_step"]
        table.add_row(
            trial_label(None, row["number"]),
            row["state"],
            format_value(row[metric]),
            str(row["batches"]),
            str(row["restarts"]),
            "-" if step is None else f"step {step}",
            format_hparams(row["hyperparameters"]),
        )
    return table


def pareto_table(described: Mapping[str, Any]) -> Table | None:
    """A multi-objective experiment's Pareto front so far (None for one objective)."""
    front = described.get("pareto_front") or []
    if not front:
        return None
    names = described["objectives"]
    table = _table(f"Pareto front ({len(front)} of the completed trials)")
    table.add_column("trial", **_SHORT)
    for name in names:
        table.add_column(name, **_SHORT)
    table.add_column("hyperparameters", **_FOLD)
    hparams = {row["number"]: row["hyperparameters"] for row in described["trials"]}
    for row in front:
        table.add_row(
            trial_label(None, row["number"]),
            *(format_value(row[name]) for name in names),
            format_hparams(hparams.get(row["number"], {})),
        )
    return table


def pruned_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N pruned at rung R (epoch E): metric M, cost C`` for each trial pruned on a
    Pareto rung, under ``describe``: where it stopped and what it had there."""
    names = described.get("objectives", [])
    return [
        f"{trial_label(None, row['number'])} pruned at rung {row['rung']} "
        f"({how_far(row['step'], row['unit'])}): "
        + ", ".join(f"{name} {format_value(row[name])}" for name in names)
        for row in described.get("pruned_at") or []
    ]


def failure_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N: reason`` for each failed trial, printed under the table of ``describe``."""
    return [
        f"{trial_label(None, row['number'])}: {row['error']}"
        for row in described["trials"]
        if row["state"] == "ERROR" and row["error"]
    ]


def skipped_checkpoint_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N: the checkpoint of step S (uuid) was skipped: problem`` for each damaged
    checkpoint a restore passed over, printed under the table of ``describe``."""
    return [
        f"{trial_label(None, row['number'])}: {checkpoint_label(skipped['uuid'], skipped['step'])} "
        f"was skipped as damaged: {skipped['problem'] or 'no reason recorded'} "
        f"(kept for inspection at {skipped['path']})"
        for row in described["trials"]
        for skipped in row["skipped_checkpoints"]
    ]


def waiting_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N waits: reason`` for each trial in the cluster's queue, under ``describe``."""
    return [
        f"{trial_label(None, row['number'])} waits: {row['waiting_reason']}"
        for row in described["trials"]
        if row["waiting_reason"]
    ]


def best_trials_table(
    trials: Sequence[TrialRow], metric: str, title: str = "Best trials"
) -> Table:
    """The best trials of one experiment with their hyperparameters and searcher metric;
    a share search's trials show their share (``1/4``) as their slots."""
    table = _table(title)
    table.add_column("trial", **_SHORT)
    table.add_column(metric, **_SHORT)
    table.add_column("slots", **_SHORT)
    table.add_column("hyperparameters", **_FOLD)
    for trial in trials:
        table.add_row(
            trial_label(None, trial.number),
            format_value(trial.searcher_metric),
            format_share(trial.share) if trial.share < 1.0 else str(trial.slots),
            format_hparams(trial.hyperparameters),
        )
    return table


# ------------------------------------------------------------------ task list
def task_rows(holders: Sequence[SlotHolder]) -> list[dict[str, Any]]:
    """One row per slot with the experiment and trial holding it (None when free).

    A warm job's slot carries the job (``warm_job_id``) and what it does
    (``warm_state``: running, reserved, idle or ending); an idle or ending job holds
    its slots without a trial. ``share`` is how much of the slot the row's holder has
    (1.0: all of it): a slot that trials share has one row per share, and one more,
    without a trial, for what is free of it.
    """
    return [
        {
            "pool": h.pool,
            "agent": h.agent,
            "host": h.host,
            "slot": h.slot,
            "share": slot_share_of(h.eighths),
            "experiment": h.experiment_id,
            "trial": (
                None
                if h.experiment_id is None or h.trial_number is None
                else trial_label(h.experiment_id, h.trial_number)
            ),
            "warm_job_id": h.warm_job_id,
            "warm_state": h.warm_state,
        }
        for h in holders
    ]


def share_text(row: Mapping[str, Any]) -> str:
    """A row's part of its slot in :func:`tasks_table`: ``1/4``, or ``1/4 free`` for what
    no trial holds of a shared slot.

    Example:
        >>> share_text({"share": 0.25, "experiment": 3}), share_text({"share": 0.5, "experiment": None})
        ('1/4', '1/2 free')
    """
    share = format_share(row["share"])
    return share if row.get("experiment") is not None else f"{share} free"


def warm_text(row: Mapping[str, Any]) -> str:
    """A slot's warm job in :func:`tasks_table`: its id and state, ``-`` for none.

    Example:
        >>> warm_text({"warm_job_id": 3, "warm_state": "idle"}), warm_text({"warm_job_id": None})
        ('3 idle', '-')
    """
    job = row.get("warm_job_id")
    return "-" if job is None else f"{job} {row.get('warm_state')}"


def tasks_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Every slot as ``task list`` prints it: where it is, the trial on it, and, when any
    slot is a warm job's, that job and its state (an idle job's slots show no trial)."""
    table = _table("Tasks")
    for column in ("pool", "agent", "host"):
        table.add_column(column, overflow="fold")
    for column in ("slot", "experiment", "trial"):
        table.add_column(column, **_SHORT)
    shared = any(row.get("share", 1.0) < 1.0 for row in rows)
    if shared:
        table.add_column("share", **_SHORT)
    warm = any(row.get("warm_job_id") is not None for row in rows)
    if warm:
        table.add_column("warm job", **_SHORT)
    for row in rows:
        cells = [
            row["pool"],
            row["agent"],
            row["host"],
            str(row["slot"]),
            format_value(row["experiment"]),
            format_value(row["trial"]),
        ]
        cells += [share_text(row)] if shared else []
        table.add_row(*cells, *([warm_text(row)] if warm else []))
    return table


def queue_rows(queued: Sequence[QueuedView], now: _dt.datetime) -> list[dict[str, Any]]:
    """One row per waiting trial of the cluster's queue, in order, with why it waits."""
    return [
        {
            "position": position,
            "pool": view.pool,
            "trial": view.label,
            "experiment": view.experiment_id,
            "experiment_name": view.experiment_name,
            "priority": view.priority,
            "weight": view.weight,
            "slots": view.slots,
            "share": view.share,
            "waiting_s": waited_s(view, now),
            "placed_on": list(view.placed_on),
            "reason": view.shown_reason,
        }
        for position, view in enumerate(queued, start=1)
    ]


def queue_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The queue as ``task list`` prints it: position, trial, priority, size, reason."""
    table = _table("Queue")
    for column in ("#", "trial", "pool", "prio", "slots", "waiting"):
        table.add_column(column, **_SHORT)
    table.add_column("reason", **_FOLD)
    for row in rows:
        table.add_row(
            str(row["position"]),
            row["trial"],
            row["pool"],
            str(row["priority"]),
            format_share(row["share"]) if row.get("share", 1.0) < 1.0 else str(row["slots"]),
            f"{row['waiting_s']:.0f} s",
            row["reason"],
        )
    return table


# --------------------------------------------------------------------- agents
def shared_lines(use: Mapping[tuple[str, str], SlotsInUse]) -> list[str]:
    """One line per agent whose slots trials share: how many, and what is free of them
    (printed under :func:`agents_table`; ``task list`` says which trials share which slot).

    Example:
        >>> from trials.queries import SlotsInUse
        >>> shared_lines({("p", "a"): SlotsInUse(1.75, 1, 0.25), ("p", "b"): SlotsInUse(2, 2, 0.0)})
        ['p/a: 1 shared slot, 1/4 of a slot free on it', 'p/b: 2 shared slots, full']
    """
    lines = []
    for (pool, agent), now in sorted(use.items()):
        if not now.shared:
            continue
        slots = "1 shared slot" if now.shared == 1 else f"{now.shared} shared slots"
        on = "it" if now.shared == 1 else "them"
        free = f"{format_share(now.room)} of a slot free on {on}" if now.room > 0 else "full"
        lines.append(f"{pool}/{agent}: {slots}, {free}")
    return lines


def agents_table(cluster: Cluster, use: Mapping[tuple[str, str], SlotsInUse] | None) -> Table:
    """Agents by pool; ``use`` (what their slots hold, :func:`trials.queries.slots_in_use`)
    adds a column when known: slots in use (a share at its fraction; :func:`shared_lines`
    says more)."""
    table = _table("Agents")
    for column in ("pool", "agent", "host", "slots"):
        table.add_column(column, overflow="fold")
    if use is not None:
        table.add_column("in use", **_SHORT)
    table.add_column("heterogeneous fits", **_SHORT)
    table.add_column("fitting policy", **_SHORT)
    for pool, agent in cluster.agents:
        cells = [pool.name, agent.name, agent.host, ",".join(str(s) for s in agent.slots)]
        if use is not None:
            now = use.get((pool.name, agent.name), SlotsInUse())
            cells.append(format_value(now.held))
        cells += [str(pool.allowing_heterogeneous_fits).lower(), pool.fitting_policy]
        table.add_row(*cells)
    return table
