"""What ``list``, ``describe``, ``task list`` and ``agents`` show: rows, then tables.

Each command gathers plain rows first (dicts of JSON types, full precision: what
``--json`` prints) and renders the same rows as a rich table for a terminal, so the
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
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from storage import Trial
from trials.labels import checkpoint_label, trial_label
from trials.numbers import format_hparams, format_value
from trials.pruning import how_far

if TYPE_CHECKING:
    from trials.coordination.allocations import SlotHolder
    from trials.coordination.cluster_queue import QueuedView
    from trials.scheduler import Cluster

# Columns of ids, states and counts: never wrapped, never cut (the text column folds).
_SHORT: dict[str, Any] = {"no_wrap": True}
_FOLD: dict[str, Any] = {"overflow": "fold", "ratio": 1}


def _table(title: str) -> Table:
    """A table that leaves its width to the data: a rule under the header, no frame,
    one space between columns, so 80 columns hold the counts and still fold text."""
    return Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)


# ----------------------------------------------------------------------- list


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


def best_trials_table(trials: Sequence[Trial], metric: str, title: str = "Best trials") -> Table:
    """The best trials of one experiment with their hyperparameters and searcher metric."""
    table = _table(title)
    table.add_column("trial", **_SHORT)
    table.add_column(metric, **_SHORT)
    table.add_column("slots", **_SHORT)
    table.add_column("hyperparameters", **_FOLD)
    for trial in trials:
        table.add_row(
            trial_label(None, trial.optuna_trial_number),
            format_value(trial.searcher_metric_value),
            str(trial.slots_per_trial),
            format_hparams(trial.hparams),
        )
    return table


# ------------------------------------------------------------------ task list
def task_rows(holders: Sequence[SlotHolder]) -> list[dict[str, Any]]:
    """One row per slot with the experiment and trial holding it (None when free).

    A warm job's slot carries the job (``warm_job_id``) and what it does
    (``warm_state``: running, reserved, idle or ending); an idle or ending job holds
    its slots without a trial.
    """
    return [
        {
            "pool": h.pool,
            "agent": h.agent,
            "host": h.host,
            "slot": h.slot,
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
            "waiting_s": round(max(0.0, (now - view.queued_at).total_seconds()), 1),
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
            str(row["slots"]),
            f"{row['waiting_s']:.0f} s",
            row["reason"],
        )
    return table


# --------------------------------------------------------------------- agents
def agents_table(cluster: Cluster, busy: Mapping[tuple[str, str], int] | None) -> Table:
    """Agents by pool; ``busy`` (slots held per (pool, agent)) adds a column when known."""
    table = _table("Agents")
    for column in ("pool", "agent", "host", "slots"):
        table.add_column(column, overflow="fold")
    if busy is not None:
        table.add_column("in use", **_SHORT)
    table.add_column("heterogeneous fits", **_SHORT)
    table.add_column("fitting policy", **_SHORT)
    for pool, agent in cluster.agents:
        cells = [pool.name, agent.name, agent.host, ",".join(str(s) for s in agent.slots)]
        if busy is not None:
            cells.append(str(busy.get((pool.name, agent.name), 0)))
        cells += [str(pool.allowing_heterogeneous_fits).lower(), pool.fitting_policy]
        table.add_row(*cells)
    return table
