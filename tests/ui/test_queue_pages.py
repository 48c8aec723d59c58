"""Why a trial waits: the cluster's queue on the Experiment and Cluster pages.

SYNTHETIC: the database of ``queued_search`` (:func:`tests._demo_data.seed_cluster_queue`),
whose waiting trials were placed or held back by the real placement decision
(:func:`trials.coordination.cluster_queue.decide`). The pages must say what ``slotsweep task list``
says, word for word. ``warm_search`` (:func:`tests._demo_data.seed_warm_jobs`) holds
slots by warm jobs in each state.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests._demo_data import DemoSearch, QueueDemo, WarmDemo
from tests.ui._pages import PageRenderer, assert_no_exception, texts, vega_charts
from tests.ui.conftest import copy_database

NOT_DECIDED = "waiting for the next placement decision"


def _tables_with(app: AppTest, column: str) -> list[pd.DataFrame]:
    """The tables on the page that have ``column``."""
    return [element.value for element in app.dataframe if column in element.value.columns]


def _table_with(app: AppTest, column: str) -> pd.DataFrame:
    """The one table on the page that has ``column``."""
    (frame,) = _tables_with(app, column)
    return frame


def _cluster(render: PageRenderer, demo: QueueDemo, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(demo.cluster_file))
    app = render("cluster", demo.url)
    assert_no_exception(app)
    return app


def test_experiment_page_says_why_each_queued_trial_waits(
    render: PageRenderer, queued_search: QueueDemo
) -> None:
    demo = queued_search
    app = render("experiment", demo.url, experiment=demo.low_experiment_id)
    assert_no_exception(app)
    assert "Waiting trials" in texts(app)
    waiting = _table_with(app, "reason").set_index("trial")
    # The running trial does not wait; the newest was asked after the last decision.
    reserved = f"agents a0, a1 reserved for trial {demo.big_trial} by backfilling"
    assert waiting["reason"].to_dict() == {
        **dict.fromkeys(demo.held_back_trials, reserved),
        demo.new_trial: NOT_DECIDED,
    }
    assert list(waiting.index) == [*demo.held_back_trials, demo.new_trial]
    assert set(waiting["slots"]) == {1} and set(waiting["priority"]) == {42}
    assert waiting.loc[demo.held_back_trials[0], "waiting"].endswith(" s")

    app = render("experiment", demo.url, experiment=demo.high_experiment_id)
    blocked = _table_with(app, "reason").set_index("trial").loc[demo.big_trial]
    assert (blocked["slots"], blocked["priority"]) == (4, 1)
    assert blocked["reason"] == "pool default has fewer than 2 free agents of 2 slots"


def test_a_paused_experiment_s_queued_trial_waits_because_it_is_paused(
    render: PageRenderer, queued_search: QueueDemo
) -> None:
    demo = queued_search
    app = render("experiment", demo.url, experiment=demo.paused_experiment_id)
    assert_no_exception(app)
    waiting = _table_with(app, "reason")
    assert waiting[["trial", "reason"]].values.tolist() == [
        [demo.paused_trial, "experiment paused"]
    ]


def test_no_waiting_section_without_queued_trials(
    render: PageRenderer, queued_search: QueueDemo, synthetic_search: DemoSearch
) -> None:
    app = render("experiment", queued_search.url, experiment=queued_search.high_experiment_id)
    assert "Waiting trials" in texts(app)
    # regression-demo's trials have all started.
    app = render("experiment", synthetic_search.url)
    assert_no_exception(app)
    assert "Waiting trials" not in texts(app)


def test_cluster_page_shows_the_queue_in_order_as_task_list_does(
    render: PageRenderer,
    queued_search: QueueDemo,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    demo = queued_search
    app = _cluster(render, demo, monkeypatch)
    shown = texts(app)
    assert "Queue" in shown
    queue = _table_with(app, "position")
    reserved = f"agents a0, a1 reserved for trial {demo.big_trial} by backfilling"
    # By pool, then priority (the priority-1 trial first), then arrival.
    assert queue[
        ["position", "trial", "experiment", "pool", "priority", "slots", "reason"]
    ].to_dict("records") == [
        {
            "position": 1,
            "trial": demo.big_trial,
            "experiment": "queue-high",
            "pool": "default",
            "priority": 1,
            "slots": 4,
            "reason": "pool default has fewer than 2 free agents of 2 slots",
        },
        *(
            {
                "position": position,
                "trial": trial,
                "experiment": "queue-low",
                "pool": "default",
                "priority": 42,
                "slots": 1,
                "reason": reserved,
            }
            for position, trial in enumerate(demo.held_back_trials, start=2)
        ),
        {
            "position": 4,
            "trial": demo.placed_trial,
            "experiment": "queue-second",
            "pool": "small",
            "priority": 42,
            "slots": 1,
            "reason": "placed on b0; starting",
        },
    ]
    # The trials outside the queue, and why.
    assert (
        f"Not in the queue: 1 queued trial(s) of queue-paused (#{demo.paused_experiment_id}): "
        "experiment paused." in shown
    )
    assert (
        f"Not in the queue: 1 queued trial(s) of queue-low (#{demo.low_experiment_id}): "
        f"{NOT_DECIDED}." in shown
    )
    # The CLI lists the same trials in the same order, in the same words.
    from searcher.cli import main

    capsys.readouterr()
    argv = ["task", "list", "--json", "--db", demo.url, "--cluster", str(demo.cluster_file)]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)["queue"]
    assert [(r["position"], r["trial"], r["reason"]) for r in cli] == list(
        zip(queue["position"], queue["trial"], queue["reason"], strict=True)
    )


def test_cluster_grid_colours_running_and_starting_trials(
    render: PageRenderer, queued_search: QueueDemo, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = queued_search
    app = _cluster(render, demo, monkeypatch)
    (_spec, default), (_spec_small, small) = vega_charts(app)
    cells = default.set_index(["agent", "slot"])["holder"].to_dict()
    assert cells == {
        ("a0", 0): f"queue-low · trial {demo.running_trial}",
        ("a0", 1): "free",
        ("a1", 0): "free",
        ("a1", 1): "free",
    }
    # The placed trial holds its slot already; its driver starts it at its next tick.
    assert set(small["holder"]) == {
        f"queue-first · trial {demo.small_running_trial}",
        f"queue-second · trial {demo.placed_trial} (starting)",
    }
    states = pd.concat(_tables_with(app, "state"))["state"]
    assert sorted(states) == ["free", "free", "free", "held", "held", "starting"]


def test_cluster_page_shows_warm_jobs_idle_or_running_which_trial(
    render: PageRenderer,
    warm_search: WarmDemo,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    demo = warm_search
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(demo.cluster_file))
    app = render("cluster", demo.url)
    assert_no_exception(app)
    assert "8 held (4 by idle or ending warm jobs), 2 free." in texts(app)
    ((spec, grid),) = vega_charts(app)
    cells = grid.groupby("agent")[["holder", "label", "warm_job"]].first()
    on = demo.agents  # job id -> its agent
    assert cells.loc[on[demo.running_job]].tolist() == [
        f"warm-search · trial {demo.running_trial} on warm job {demo.running_job}",
        demo.running_trial,
        f"warm job {demo.running_job} (running)",
    ]
    assert cells.loc[on[demo.reserved_job]].tolist() == [
        f"warm-search · trial {demo.reserved_trial} (starting on warm job {demo.reserved_job})",
        demo.reserved_trial,
        f"warm job {demo.reserved_job} (reserved)",
    ]
    # An idle (or ending) job holds its slots, not the finished trial it ran last.
    assert cells.loc[on[demo.idle_job]].tolist() == [
        f"warm-search · warm job {demo.idle_job} idle",
        "idle",
        f"warm job {demo.idle_job} (idle)",
    ]
    assert cells.loc[on[demo.ending_job], "holder"] == (
        f"warm-search · warm job {demo.ending_job} ending"
    )
    assert cells.loc["w4"].tolist() == ["free", "", ""]
    assert not any(trial in " ".join(grid["holder"]) for trial in demo.finished_trials)
    # Idle and ending jobs have legend entries of their own, in colours no trial takes.
    scale = spec["layer"][0]["encoding"]["color"]["scale"]
    colour = dict(zip(scale["domain"], scale["range"], strict=True))
    jobless = {cells.loc[on[job], "holder"] for job in (demo.idle_job, demo.ending_job)}
    busy = {colour[holder] for holder in scale["domain"] if holder not in jobless}
    jobless = {colour[holder] for holder in jobless}
    assert len(jobless) == 2 and jobless.isdisjoint(busy)

    slots = _table_with(app, "warm job").set_index("agent")
    states = slots.groupby(level=0)["state"].first().to_dict()
    assert states == {
        on[demo.running_job]: "held",
        on[demo.reserved_job]: "starting",
        on[demo.idle_job]: "warm job idle",
        on[demo.ending_job]: "warm job ending",
        "w4": "free",
    }
    idle_rows = slots.loc[on[demo.idle_job]]
    # No trial on an idle job's slots: empty cells, not "None" (issue 33).
    assert set(idle_rows["open"]) == {""} and "trial #" not in slots.columns
    assert set(idle_rows["warm job"]) == {str(demo.idle_job)}
    allocations = _table_with(app, "warm_state")
    assert allocations.groupby("agent")["warm_state"].first().tolist() == [
        "running",
        "reserved",
        "idle",
        "ending",
    ]
    summary = _table_with(app, "warm_jobs").set_index("agent")
    assert summary["trials"].tolist() == [1, 1, 0, 0] and set(summary["warm_jobs"]) == {1}

    # `slotsweep task list` names each slot's trial and warm job as the page does.
    from searcher.cli import main

    capsys.readouterr()
    argv = ["task", "list", "--json", "--db", demo.url, "--cluster", str(demo.cluster_file)]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)["slots"]
    shown = grid.set_index(["agent", "slot"])
    job_on = {agent: job for job, agent in demo.agents.items()}
    for row in cli:
        cell = shown.loc[(row["agent"], row["slot"])]
        assert (row["trial"] or row["warm_state"] or "") == cell["label"]
        assert row["warm_job_id"] == job_on.get(row["agent"])


def test_empty_queue_says_so(
    render: PageRenderer, synthetic_search: DemoSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = render("cluster", synthetic_search.url)
    assert_no_exception(app)
    assert "No trial is waiting for slots." in texts(app)


def test_reading_the_queue_leaves_the_database_unchanged(
    render: PageRenderer,
    queued_search: QueueDemo,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url = copy_database(queued_search.url, tmp_path / "copy.db")
    path = url.removeprefix("sqlite:///")

    def dump() -> list[str]:
        with sqlite3.connect(path) as conn:
            return list(conn.iterdump())

    before = dump()
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(queued_search.cluster_file))
    assert_no_exception(render("cluster", url))
    assert_no_exception(render("experiment", url, experiment=queued_search.low_experiment_id))
    assert dump() == before
