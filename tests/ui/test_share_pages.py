"""Shares of one slot on the Cluster, Experiment and Trial pages (issue 52, item 5).

SYNTHETIC: a search on quarters of a slot (``resources.slots_per_trial: 0.25``) whose
two running trials hold a quarter each of slot 0 of agent ``a0`` (claimed through the
slot ledger), and a whole-slot search holding slot 1. The Cluster page must say which
trials share which slot and how much of it is free, as ``slotsweep task list`` does;
the Experiment and Trial pages count a share trial at its share.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from storage import Experiment, Trial, TrialState, session_scope, upgrade_schema
from tests.conftest import EXAMPLES_DIR, add_experiment
from tests.ui._pages import PageRenderer, assert_no_exception, texts, vega_charts
from trials.config import load_config
from trials.coordination import allocations
from trials.scheduler import Agent, AgentSlots, Placement

A0 = Agent("a0", "127.0.0.1", (0, 1))


def _config(share: float) -> dict[str, object]:
    config = load_config(EXAMPLES_DIR / "digits" / "experiment.yaml")
    resources = config.resources.model_copy(update={"slots_per_trial": share})
    return config.model_copy(update={"resources": resources}).model_dump(mode="json")


def _hold(url: str, experiment_id: int, trial_id: int, slot: int, share: float) -> None:
    placement = Placement(trial_id, "default", (AgentSlots(A0, (slot,)),), share=share)
    with session_scope(url) as session:
        assert allocations.claim(
            session, placement, trial_id=trial_id, experiment_id=experiment_id, lease_s=3600
        )


@pytest.fixture
def shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, render: PageRenderer
) -> tuple[str, int, list[int], int]:
    """The database, the share search's id, its trials (two running, one done) and the
    whole-slot search's id; the Cluster page's layout is this database's agent."""
    url = f"sqlite:///{tmp_path / 'shares.db'}"
    upgrade_schema(url)
    quarters, (first, second, done) = add_experiment(
        url,
        [{}, {}, {"state": TrialState.COMPLETED, "slot_seconds": 15.0}],
        name="quarters",
    )
    whole, (big,) = add_experiment(url, [{}], name="whole")
    with session_scope(url) as session:
        session.get_one(Experiment, quarters).config = _config(0.25)
        session.get_one(Experiment, whole).config = _config(1)
    _hold(url, quarters, first, 0, 0.25)
    _hold(url, quarters, second, 0, 0.25)
    _hold(url, whole, big, 1, 1.0)
    cluster = tmp_path / "cluster.yaml"
    agent = {"name": "a0", "host": "127.0.0.1", "slots": 2}
    cluster.write_text(
        yaml.safe_dump({"resource_pools": [{"name": "default", "agents": [agent]}]})
    )
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(cluster))
    return url, quarters, [first, second, done], whole


def test_the_cluster_page_shows_which_trials_share_a_slot_and_what_is_free(
    render: PageRenderer, shares: tuple[str, int, list[int], int]
) -> None:
    url, quarters, _, whole = shares
    app = render("cluster", url)
    assert_no_exception(app)
    assert "2 held, 1 of them shared by several trials with 1/2 of a slot free on them" in texts(
        app
    )
    ((_spec, grid),) = vega_charts(app)
    cells = grid.set_index("slot")
    assert cells.loc[0, "label"] == f"{quarters}.0 {quarters}.1"
    assert cells.loc[0, "holder"] == (
        f"quarters · shared by {quarters}.0 (1/4), {quarters}.1 (1/4), 1/2 free"
    )
    assert cells.loc[1, "holder"] == f"whole · trial {whole}.0"
    agents, slots = (frame.value for frame in app.dataframe[:2])
    assert agents.set_index("agent").loc["a0", ["held", "free", "shared"]].tolist() == [2, 0, 1]
    assert slots[["slot", "state", "share", "experiment"]].values.tolist() == [
        [0, "held", "1/4", "quarters"],
        [0, "held", "1/4", "quarters"],
        [0, "free", "1/2 free", ""],
        [1, "held", "", "whole"],
    ]
    summary = app.dataframe[2].value
    assert summary.set_index("agent").loc["a0", "slots_held"] == pytest.approx(1.5)


def test_experiment_and_trial_pages_count_a_share_trial_at_its_share(
    render: PageRenderer, shares: tuple[str, int, list[int], int]
) -> None:
    url, quarters, (first, _, done), _ = shares
    app = render("experiment", url, experiment=quarters)
    assert_no_exception(app)
    metrics = {metric.label: metric.value for metric in app.metric}
    assert metrics["Slots in use"] == "0.5"
    trials = next(frame.value for frame in app.dataframe if "slot_seconds" in frame.value.columns)
    assert set(trials["slots"]) == {0.25}
    assert trials.set_index("id").loc[done, "slot_seconds"] == pytest.approx(15.0)
    with session_scope(url) as session:
        number = session.get_one(Trial, first).optuna_trial_number
    app = render("trial", url, trial=f"{quarters}.{number}")
    assert_no_exception(app)
    assert {metric.label: metric.value for metric in app.metric}["Slots"] == "1/4"
