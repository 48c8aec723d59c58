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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from storage import Trial
from trials.config import EIGHTHS_PER_SLOT, format_share, slot_share_of
from trials.labels import trial_label
from trials.numbers import format_hparams, format_value

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


def failure_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N: reason`` for each failed trial, printed under the table of ``describe``."""
    return [
        f"{trial_label(None, row['number'])}: {row['error']}"
        for row in described["trials"]
        if row["state"] == "ERROR" and row["error"]
    ]


def waiting_lines(described: Mapping[str, Any]) -> list[str]:
    """``#N waits: reason`` for each trial in the cluster's queue, under ``describe``."""
    return [
        f"{trial_label(None, row['number'])} waits: {row['waiting_reason']}"
        for row in described["trials"]
        if row["waiting_reason"]
    ]


def best_trials_table(
    trials: Sequence[Trial], metric: str, title: str = "Best trials", *, share: float = 1.0
) -> Table:
    """The best trials of one experiment with their hyperparameters and searcher metric.

    ``share``: the experiment's share of one slot; its trials show it (``1/4``) as slots.
    """
    table = _table(title)
    table.add_column("trial", **_SHORT)
    table.add_column(metric, **_SHORT)
    table.add_column("slots", **_SHORT)
    table.add_column("hyperparameters", **_FOLD)
    for trial in trials:
        table.add_row(
            trial_label(None, trial.optuna_trial_number),
            format_value(trial.searcher_metric_value),
            format_share(share) if share < 1.0 else str(trial.slots_per_trial),
            format_hparams(trial.hparams),
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
            format_share(row["share"]) if row.get("share", 1.0) < 1.0 else str(row["slots"]),
            f"{row['waiting_s']:.0f} s",
            row["reason"],
        )
    return table


# --------------------------------------------------------------------- agents
@dataclass(frozen=True)
class AgentUse:
    """What an agent's slots hold now: slots in use (a share at its fraction), how many
    slots trials share, and what is free of those."""

    held: float = 0.0
    shared: int = 0
    room: float = 0.0


def agent_use(holders: Sequence[SlotHolder]) -> dict[tuple[str, str], AgentUse]:
    """Each (pool, agent)'s use from the ledger's holders (stale claims left out).

    Example:
        >>> from trials.coordination.allocations import SlotHolder
        >>> use = agent_use([SlotHolder("p", "a", "h", 0, 1, 1, eighths=2),
        ...                  SlotHolder("p", "a", "h", 0, 1, 2, eighths=4),
        ...                  SlotHolder("p", "a", "h", 1, 1, 3)])
        >>> use[("p", "a")]
        AgentUse(held=1.75, shared=1, room=0.25)
    """
    held: dict[tuple[str, str], float] = {}
    shares: dict[tuple[str, str, int], float] = {}
    for h in holders:
        if not h.held or h.stale:
            continue
        key = (h.pool, h.agent)
        held[key] = held.get(key, 0.0) + slot_share_of(h.eighths)
        if h.eighths < EIGHTHS_PER_SLOT:
            slot = (h.pool, h.agent, h.slot)
            shares[slot] = shares.get(slot, 0.0) + slot_share_of(h.eighths)
    use = {key: AgentUse(held=value) for key, value in held.items()}
    for (pool, agent, _), used in shares.items():
        was = use[(pool, agent)]
        use[(pool, agent)] = AgentUse(was.held, was.shared + 1, was.room + 1.0 - used)
    return use


def shared_lines(use: Mapping[tuple[str, str], AgentUse]) -> list[str]:
    """One line per agent whose slots trials share: how many, and what is free of them
    (printed under :func:`agents_table`; ``task list`` says which trials share which slot).

    Example:
        >>> shared_lines({("p", "a"): AgentUse(1.75, 1, 0.25), ("p", "b"): AgentUse(2, 2, 0.0)})
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


def agents_table(cluster: Cluster, use: Mapping[tuple[str, str], AgentUse] | None) -> Table:
    """Agents by pool; ``use`` (what their slots hold, :func:`agent_use`) adds columns when
    known: slots in use (a share at its fraction; :func:`shared_lines` says more)."""
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
            now = use.get((pool.name, agent.name), AgentUse())
            cells.append(format_value(now.held))
        cells += [str(pool.allowing_heterogeneous_fits).lower(), pool.fitting_policy]
        table.add_row(*cells)
    return table
