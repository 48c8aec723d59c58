"""The read model's answers that the CLI, the API and the UI share: one count of an
experiment's trials, one "best trials", one lookup of a trial by number, the newest
checkpoint, the same from an engine, a session or an open connection."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from storage import (
    Allocation,
    Checkpoint,
    CheckpointState,
    Experiment,
    TrialState,
    get_engine,
    session_scope,
    utcnow,
)
from tests.conftest import EXAMPLES_DIR, REPO_ROOT, add_experiment
from trials import queries
from trials.config import load_config


def _with_config(url: str, experiment_id: int, *, smaller_is_better: bool) -> None:
    """Give the experiment a readable stored config with the searcher's direction."""
    config = load_config(EXAMPLES_DIR / "digits" / "experiment.yaml").model_dump(mode="json")
    config["searcher"]["smaller_is_better"] = smaller_is_better
    with session_scope(url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.config = config


def _trials(*states_and_values: tuple[TrialState, float | None]) -> list[dict[str, Any]]:
    return [{"state": state, "searcher_metric_value": value} for state, value in states_and_values]


DONE = TrialState.COMPLETED


def test_one_count_per_state_from_an_engine_a_session_or_a_connection(db_url: str) -> None:
    experiment_id, _ = add_experiment(
        db_url,
        _trials(
            (DONE, 0.5),
            (DONE, 0.25),
            (TrialState.PRUNED, None),
            (TrialState.ERROR, None),
            (TrialState.QUEUED, None),
            (TrialState.NOT_RUN, None),
            (TrialState.RUNNING, None),
        ),
    )
    empty, _ = add_experiment(db_url, [])
    expected = queries.TrialCounts(
        total=7, queued=1, running=1, completed=2, pruned=1, errored=1, not_run=1
    )
    engine = get_engine(db_url, read_only=True)
    with session_scope(db_url) as session:
        assert queries.trial_counts(session, experiment_id) == expected
    with engine.connect() as conn:
        assert queries.trial_counts(conn, experiment_id) == expected
    assert queries.trial_counts(engine, experiment_id) == expected
    assert queries.trial_total(engine, experiment_id) == 7
    assert expected.finished == 4  # what ran to an end: NOT_RUN never ran
    assert expected.by_state() == {
        "QUEUED": 1,
        "RUNNING": 1,
        "COMPLETED": 2,
        "PRUNED": 1,
        "ERROR": 1,
        "NOT_RUN": 1,
    }
    assert queries.trial_counts(engine, empty) == queries.TrialCounts()
    # The UI's header counts the same trials.
    summary = queries.experiment_summary(engine, experiment_id)
    assert summary is not None and summary.counts == expected.by_state()
    assert summary.finished == 5  # every trial in an end state, NOT_RUN included


@pytest.mark.parametrize(("smaller", "best"), [(True, [3, 1, 2]), (False, [0, 1, 2])])
def test_best_trials_follow_the_direction_and_break_ties_by_number(
    db_url: str, smaller: bool, best: list[int]
) -> None:
    experiment_id, _ = add_experiment(
        db_url,
        _trials(
            (DONE, 0.9),
            (DONE, 0.5),
            (DONE, 0.5),
            (DONE, 0.1),
            (TrialState.PRUNED, 0.01),  # not completed: never best
            (DONE, None),  # completed without a value: never best
        ),
    )
    engine = get_engine(db_url, read_only=True)
    rows = queries.best_trials(engine, experiment_id, smaller_is_better=smaller, limit=3)
    assert [row.number for row in rows] == best
    assert all(row.state == DONE for row in rows)
    assert list(queries.trial_frame(rows)["number"]) == best
    _with_config(db_url, experiment_id, smaller_is_better=smaller)
    summary = queries.experiment_summary(engine, experiment_id)
    assert summary is not None and summary.best_value == rows[0].searcher_metric


def test_overviews_list_every_experiment_with_its_counts_and_best(db_url: str) -> None:
    larger, _ = add_experiment(db_url, _trials((DONE, 0.2), (DONE, 0.7)), name="larger")
    _with_config(db_url, larger, smaller_is_better=False)
    unreadable, (trial_id,) = add_experiment(db_url, _trials((DONE, 0.3)), name="old")
    with session_scope(db_url) as session:
        session.add(
            Allocation(
                resource_pool="default",
                agent="local",
                host="127.0.0.1",
                slot=0,
                trial_id=trial_id,
                experiment_id=unreadable,
                lease_expires_at=utcnow(),
            )
        )
    engine = get_engine(db_url, read_only=True)
    first, second = queries.experiment_overviews(engine)
    assert (first.id, first.best, first.metric) == (larger, 0.7, "val_loss")
    assert (first.counts.completed, first.slots_in_use) == (2, 0)
    # A config this version cannot read: the list shows the rest, in the default direction.
    assert (second.id, second.config, second.metric, second.best) == (unreadable, None, None, 0.3)
    assert second.slots_in_use == 1
    newest = queries.experiment_overviews(engine, newest_first=True, limit=1)
    assert [o.id for o in newest] == [unreadable]
    page = queries.list_experiments(engine)
    assert list(page.rows["id"]) == [unreadable, larger]
    assert list(page.rows["best"]) == [0.3, 0.7]


def test_a_trial_by_number_and_its_newest_checkpoint(db_url: str) -> None:
    experiment_id, (first, second) = add_experiment(db_url, _trials((DONE, 0.1), (DONE, 0.2)))
    with session_scope(db_url) as session:
        for step, state in ((10, CheckpointState.COMPLETED), (20, CheckpointState.COMPLETED)):
            session.add(
                Checkpoint(
                    uuid=f"c{step}", trial_id=first, step=step, path=f"/ck/{step}", state=state
                )
            )
        # A newer step that retention deleted is not the one to restore from.
        session.add(
            Checkpoint(
                uuid="c30", trial_id=first, step=30, path="/ck/30", state=CheckpointState.DELETED
            )
        )
    engine = get_engine(db_url, read_only=True)
    assert queries.trial_id(engine, experiment_id, 1) == second
    assert queries.trial_id(engine, experiment_id, 5) is None
    assert queries.newest_checkpoint_path(engine, first) == "/ck/20"
    assert queries.newest_checkpoint_path(engine, second) is None
    assert queries.newest_checkpoint_steps(engine, experiment_id) == {first: 20}
    (row, _) = queries.experiment_trials(engine, experiment_id)
    assert (row.id, row.label, row.searcher_metric) == (first, f"{experiment_id}.0", 0.1)


@pytest.mark.slow  # starts a Python process
def test_reading_counts_and_rows_does_not_import_pandas() -> None:
    # The driver and the CLI read counts and typed rows here; pandas (half a second to
    # import) loads only with the first frame a query builds.
    code = (
        "import sys\n"
        "from trials import queries\n"
        "import searcher.cli.tables\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "False", done.stderr
