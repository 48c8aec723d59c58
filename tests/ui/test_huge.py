"""1,000 trials and 200,000 metric rows: every page renders, paged and aggregated in SQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests.ui._pages import PageRenderer, assert_no_exception, texts


@pytest.mark.slow
def test_every_page_renders_the_huge_experiment(
    render: PageRenderer, huge_db: tuple[str, int]
) -> None:
    url, experiment_id = huge_db
    with get_engine(url).connect() as conn:
        assert (
            conn.execute(sa.text("SELECT COUNT(*) FROM slotsweep_metrics")).scalar_one() == 200_000
        )
        trial_id = conn.execute(
            sa.text("SELECT MAX(id) FROM slotsweep_trials WHERE experiment_id = :e"),
            {"e": experiment_id},
        ).scalar_one()

    app = render("experiments", url)
    assert_no_exception(app)
    assert app.dataframe[0].value.loc[0, "done"].endswith("/1000")

    app = render("experiment", url, experiment=experiment_id)
    assert_no_exception(app)
    assert "Rows 1–50 of 1000." in texts(app)
    assert len(app.dataframe[1].value) == 50
    control = app.segmented_control(key=f"plot_kind_{experiment_id}")
    for kind in control.options:
        control.set_value(kind).run()
        assert_no_exception(app)
        assert app.get("plotly_chart"), kind
    app.number_input(key=f"trials_page_{experiment_id}").set_value(20).run()
    assert "Rows 951–1000 of 1000." in texts(app)

    app = render("trial", url, trial=trial_id)
    assert_no_exception(app)
    assert "180 recorded values" in texts(app)
    system = app.dataframe[-1].value
    assert set(system["gpu"]) == {"GPU 0", "GPU 1", "host"}

    app = render("cluster", url)
    assert_no_exception(app)
    assert app.dataframe[-1].value["trial_state"].eq("RUNNING").all()


@pytest.mark.slow
def test_huge_study_reads_back_through_optuna(huge_db: tuple[str, int]) -> None:
    import optuna

    from storage import optuna_storage

    url, experiment_id = huge_db
    with get_engine(url).connect() as conn:
        study_name = conn.execute(
            sa.text("SELECT study_name FROM slotsweep_experiments WHERE id = :e"),
            {"e": experiment_id},
        ).scalar_one()
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(url, read_only=True))
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 1000
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(len(t.intermediate_values) == 10 for t in trials)
    assert set(complete[0].params) == {"global_batch_size", "lr", "optimizer", "warmup_epochs"}
    # The UI's lean read of the same study gives Optuna's plots the same trials.
    from ui import _plots

    copy = _plots.snapshot_study(url, study_name).get_trials(deepcopy=False)
    assert [(t.number, t.state, t.values, t.params, t.intermediate_values) for t in copy] == [
        (t.number, t.state, t.values, t.params, t.intermediate_values) for t in trials
    ]
