"""Cluster: resource pools, agents, every slot and the trial holding it; the queue and why."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from streamlit.elements.lib.column_types import ColumnConfig

from storage import TrialState
from trials import queries
from trials.config import format_share
from trials.labels import trial_label
from ui import _charts, _cluster, _context, _units

st.title("Cluster")
engine = _context.require_database()


def _layout_section(layout: list[_cluster.AgentLayout]) -> None:
    for pool in sorted({agent.pool for agent in layout}):
        agents = [agent for agent in layout if agent.pool == pool]
        held = queries.held_slots(engine, pool, [agent.name for agent in agents])
        total = sum(len(agent.slots) for agent in agents)
        jobless = sum(all(not _trial_holds(h) for h in on_slot) for on_slot in held.values())
        shared = {key: on_slot for key, on_slot in held.items() if _shared(on_slot)}
        st.markdown(f"#### Pool `{pool}`")
        st.caption(
            f"{len(agents)} agent(s), {total} slot(s), {len(held)} held"
            + (f" ({jobless} by idle or ending warm jobs)" if jobless else "")
            + (
                f", {len(shared)} of them shared by several trials with "
                f"{format_share(sum(map(_room, shared.values())))} of a slot free on them"
                if shared
                else ""
            )
            + f", {total - len(held)} free."
        )
        _slot_grid(agents, held)
        per_agent = [
            {
                "agent": agent.name,
                "host": agent.host,
                "slots": len(agent.slots),
                "held": sum((agent.name, s) in held for s in agent.slots),
                "free": sum((agent.name, s) not in held for s in agent.slots),
                **(
                    {"shared": sum((agent.name, s) in shared for s in agent.slots)}
                    if shared
                    else {}
                ),
            }
            for agent in agents
        ]
        st.dataframe(pd.DataFrame(per_agent), hide_index=True, width="stretch")
        # A free slot's cells are empty, not "None"; a trial reads EXPERIMENT.NUMBER, as
        # in the slot map above and in every other table. A shared slot has a row per
        # share and one for what is free of it.
        slots = pd.DataFrame(
            [
                {
                    "agent": agent.name,
                    "slot": slot,
                    "state": _slot_state(holder),
                    **({"share": _share_text(holder, on_slot)} if shared else {}),
                    "experiment": (holder or {}).get("experiment") or "",
                    "open": _trial_link(holder) or "",
                    "warm job": _warm_job_text((holder or {}).get("warm_job_id")),
                }
                for agent in agents
                for slot in agent.slots
                for on_slot in [held.get((agent.name, slot), [])]
                for holder in _slot_rows(on_slot)
            ]
        )
        st.dataframe(
            slots,
            hide_index=True,
            width="stretch",
            column_config={
                "open": _trial_column(),
                "warm job": st.column_config.TextColumn(
                    "warm job",
                    help="The warm job (`resources.reuse_workers`) whose workers hold the slot.",
                ),
                "share": st.column_config.TextColumn(
                    "share", help="How much of the slot the trial holds, or is free."
                ),
            },
        )


def _share_of(holder: dict[str, object]) -> float:
    """How much of its slot a holder has (1.0: all of it)."""
    share = holder.get("share")
    return float(share) if isinstance(share, (int, float)) and share > 0 else 1.0


def _shared(on_slot: list[dict[str, object]]) -> bool:
    """Whether trials share the slot (its holders hold shares of it)."""
    return any(_share_of(h) < 1.0 for h in on_slot)


def _room(on_slot: list[dict[str, object]]) -> float:
    """What is free of a shared slot, as a fraction of it."""
    return 1.0 - sum(_share_of(h) for h in on_slot)


def _slot_rows(on_slot: list[dict[str, object]]) -> list[dict[str, object] | None]:
    """A slot's rows in the slot table: its holders, and None for what is free of it."""
    if not on_slot:
        return [None]
    return [*on_slot, *([None] if _shared(on_slot) and _room(on_slot) > 0 else [])]


def _share_text(holder: dict[str, object] | None, on_slot: list[dict[str, object]]) -> str:
    """A slot table row's share: the holder's (``1/4``), what is free of a shared slot
    (``1/4 free``), nothing for a free slot or one held whole."""
    if holder is not None:
        share = _share_of(holder)
        return format_share(share) if share < 1.0 else ""
    return f"{format_share(_room(on_slot))} free" if on_slot else ""


def _trial_column() -> ColumnConfig:
    """A link column showing the trial's ``EXPERIMENT.NUMBER`` taken from its link."""
    return st.column_config.LinkColumn("trial", display_text=r"trial=([^&]+)")


def _warm_job_text(warm_job_id: object) -> str:
    return "" if warm_job_id is None or pd.isna(warm_job_id) else str(int(warm_job_id))  # type: ignore[call-overload]


def _trial(holder: dict[str, object]) -> str:
    return trial_label(int(holder["experiment_id"]), int(holder["optuna_trial_number"]))  # type: ignore[call-overload]


def _trial_holds(holder: dict[str, object]) -> bool:
    # An idle or ending warm job holds its slots without a trial.
    return holder.get("trial_id") is not None


def _trial_link(holder: dict[str, object] | None) -> str | None:
    if holder is None or not _trial_holds(holder):
        return None
    return _context.link("trial", trial=_trial(holder))


def _starting(holder: dict[str, object]) -> bool:
    # A placement decision claimed the slots (or reserved an idle warm job for the
    # trial); the trial's driver starts it next tick.
    return holder.get("trial_state") == TrialState.QUEUED.value


def _slot_state(holder: dict[str, object] | None) -> str:
    if holder is None:
        return _charts.FREE
    if not _trial_holds(holder):
        return f"warm job {holder.get('warm_state')}"
    return "starting" if _starting(holder) else "held"


def _holder_label(holder: dict[str, object]) -> str:
    """The legend's name for a slot's holder: a trial, or an idle or ending warm job."""
    experiment = holder.get("experiment") or "experiment ?"
    job = holder.get("warm_job_id")
    if not _trial_holds(holder):
        return f"{experiment} · warm job {job} {holder.get('warm_state')}"
    label = f"{experiment} · trial {_trial(holder)}"
    if job is None:
        return f"{label} (starting)" if _starting(holder) else label
    if _starting(holder):
        return f"{label} (starting on warm job {job})"
    return f"{label} on warm job {job}"


def _cell_label(holder: dict[str, object] | None) -> str:
    """The text inside a slot's cell: the trial's EXPERIMENT.NUMBER, or the job's state."""
    if holder is None:
        return ""
    return _trial(holder) if _trial_holds(holder) else str(holder.get("warm_state"))


def _slot_grid(
    agents: list[_cluster.AgentLayout], held: dict[tuple[str, int], list[dict[str, object]]]
) -> None:
    """Every slot of the pool as a cell, coloured by the trial or warm job holding it.

    An idle or ending warm job has its own colour (a muted one: it trains nothing), and
    every slot of a warm job, running a trial or not, has a dark dashed outline. A slot
    that trials share is one cell naming them all, with what is free of it.
    """
    cells = pd.DataFrame(
        [
            _grid_cell(agent.name, slot, held.get((agent.name, slot), []))
            for agent in agents
            for slot in agent.slots
        ]
    )
    on_slots = list(held.values())
    holders = sorted({_slot_holder(o) for o in on_slots if any(map(_trial_holds, o))})
    idle = sorted({_slot_holder(o) for o in on_slots if not any(map(_trial_holds, o))})
    spec = _charts.slot_grid_spec(holders, len(agents), idle_warm_jobs=idle)
    # The height Streamlit gives the chart, not the spec's: without it the grid was
    # squeezed into a 40 px strip and its legend cut off.
    st.vega_lite_chart(cells, spec, height=_charts.slot_grid_height(spec), width="stretch")


def _slot_holder(on_slot: list[dict[str, object]]) -> str:
    """The legend's name for a slot's holders: one trial or warm job, or the shares on it."""
    if not _shared(on_slot):
        return _holder_label(on_slot[0])
    shares = ", ".join(f"{_cell_label(h)} ({format_share(_share_of(h))})" for h in on_slot)
    experiments = " + ".join(sorted({str(h.get("experiment") or "experiment ?") for h in on_slot}))
    room = _room(on_slot)
    free = f", {format_share(room)} free" if room > 0 else ""
    return f"{experiments} · shared by {shares}{free}"


def _grid_cell(agent: str, slot: int, on_slot: list[dict[str, object]]) -> dict[str, object]:
    """One cell of the slot grid: the slot, its holder(s) and the text inside it."""
    jobs = [h for h in on_slot if h.get("warm_job_id") is not None]
    return {
        "agent": agent,
        "slot": slot,
        "holder": _slot_holder(on_slot) if on_slot else _charts.FREE,
        "label": " ".join(_cell_label(h) for h in on_slot),
        "warm_job": "; ".join(f"warm job {h['warm_job_id']} ({h['warm_state']})" for h in jobs),
    }


@st.cache_resource(ttl=30, show_spinner=False)
def _layout() -> tuple[list[_cluster.AgentLayout] | None, str | None]:
    # The cluster file (or NVML probe) changes rarely; re-read it every 30 s at most.
    return _cluster.load_layout()


def _queue_section() -> None:
    """The cluster's queue in the order trials start, each with the scheduler's reason."""
    st.markdown("#### Queue")
    queue = queries.queued_trials(engine)
    outside = queries.queued_outside_queue(engine)
    if queue.empty:
        st.info("No trial is waiting for slots.")
    else:
        rows = queue.assign(
            waiting=queue["waiting_s"].map(_units.duration_words),
            open=[_context.link("trial", trial=str(t)) for t in queue["trial"]],
        )
        st.dataframe(
            rows,
            hide_index=True,
            width="stretch",
            column_order=[
                "position",
                "trial",
                "open",
                "experiment",
                "pool",
                "priority",
                "slots",
                *(["share"] if (queue["share"] != "").any() else []),
                "waiting",
                "reason",
            ],
            column_config={
                "position": st.column_config.NumberColumn("#"),
                "open": st.column_config.LinkColumn("open", display_text="open"),
                "priority": st.column_config.NumberColumn("priority", help="Lower runs first."),
                "reason": st.column_config.TextColumn("why it waits", width="large"),
            },
        )
        st.caption(
            "In the order trials start: by pool, then priority (lower first), then "
            "arrival. Within a priority, fair share may start another experiment's "
            "trial first; the reason says so. Reasons are the scheduler's, from its "
            "latest placement decision, as `slotsweep task list` prints them."
        )
    for row in outside.itertuples():
        st.caption(
            f"Not in the queue: {row.trials} queued trial(s) of {row.experiment} "
            f"(#{row.experiment_id}): {row.reason}."
        )


def _page() -> None:
    layout, why_not = _layout()
    if layout is not None:
        _layout_section(layout)
    else:
        st.info(why_not)
    _queue_section()

    st.markdown("#### Slots held, by agent")
    summary = queries.allocation_summary(engine)
    if summary.empty:
        st.info("No slot is held: no trial is running.")
        return
    if layout is not None:
        known = {(agent.pool, agent.name) for agent in layout}
        unknown = sorted(
            {
                f"{pool}/{agent}"
                for pool, agent in zip(summary["pool"], summary["agent"], strict=True)
            }
            - {f"{pool}/{agent}" for pool, agent in known}
        )
        if unknown:
            st.warning(
                "Slots are held on agents that this cluster layout does not list "
                f"(another cluster file, or a renamed machine): {', '.join(unknown)}."
            )
    st.dataframe(
        summary,
        hide_index=True,
        width="stretch",
        column_config={"since": st.column_config.DatetimeColumn("oldest allocation (UTC)")},
    )
    st.markdown("#### Allocations")
    total = queries.allocations(engine, limit=1).total
    offset = _context.pager(total, key="allocations_page", page_size=200)
    page = queries.allocations(engine, limit=200, offset=offset)
    rows = page.rows.assign(
        warm_job_id=[_warm_job_text(j) for j in page.rows["warm_job_id"]],
        warm_state=page.rows["warm_state"].fillna(""),
        open=[
            "" if pd.isna(i) else _context.link("trial", trial=_context.trial_ref(int(e), int(n)))
            for i, e, n in zip(
                page.rows["trial_id"],
                page.rows["experiment_id"],
                page.rows["trial_number"],
                strict=True,
            )
        ],
    )
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_order=[
            "open",
            "pool",
            "agent",
            "host",
            "slot",
            "experiment",
            "trial_state",
            "warm_job_id",
            "warm_state",
            "allocated_at",
            "lease_expires_at",
        ],
        column_config={
            "open": _trial_column(),
            "warm_job_id": st.column_config.TextColumn("warm job"),
            "warm_state": st.column_config.TextColumn(
                "warm job state", help="running, reserved (starting), idle or ending"
            ),
            "allocated_at": st.column_config.DatetimeColumn("allocated (UTC)"),
            "lease_expires_at": st.column_config.DatetimeColumn("lease expires (UTC)"),
        },
    )
    st.caption(_context.rows_caption(page.offset, len(rows), page.total))


_context.live(_page)
