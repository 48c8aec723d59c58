"""The gateway to Optuna's data, on real databases holding real Optuna studies.

Every read is checked against what Optuna's own public storage returns for the same
study. CI runs this module twice: with the pinned Optuna and with the oldest release
``pyproject.toml`` allows (``.ci/test``), so both must read the same tables alike.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from storage import (
    KNOWN_OPTUNA_SCHEMAS,
    OptunaSchemaError,
    get_engine,
    optuna_schema_revision,
    optuna_storage,
    optuna_trial_id,
    optuna_writes_together,
    read_study,
    study_signature,
    study_trials,
    upgrade_schema,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _searched_study(url: str, name: str) -> optuna.Study:
    """A single-objective study with a trial in every state, reports and special values."""
    study = optuna.create_study(study_name=name, storage=optuna_storage(url))

    def suggest(trial: optuna.Trial) -> None:
        trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        trial.suggest_int("warmup", 0, 5)
        trial.suggest_categorical("optimizer", ["sgd", "adamw"])
        trial.suggest_categorical("layers", [None, 2, 2.5, True])

    for number, value in enumerate([0.5, 0.25, math.inf, 0.125]):
        trial = study.ask()
        suggest(trial)
        for step in range(3):
            trial.report(value + step, step)
        study.tell(trial, value)
        assert trial.number == number
    pruned = study.ask()
    suggest(pruned)
    pruned.report(-math.inf, 1)
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    running = study.ask()
    suggest(running)
    running.report(float("nan"), 0)
    study.enqueue_trial({"lr": 0.01, "warmup": 1})
    return study


def _multi_objective_study(url: str, name: str) -> optuna.Study:
    study = optuna.create_study(
        study_name=name, storage=optuna_storage(url), directions=["minimize", "maximize"]
    )
    with warnings.catch_warnings():
        # Experimental since Optuna 3.2; the UI reads the names it sets.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["val_loss", "accuracy"])
    for x in (0.1, 0.2, 0.3):
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)
        # Where a sampler's constraints_func puts its result.
        optuna_storage(url).set_trial_system_attr(
            optuna_trial_id(url, name, trial.number), "constraints", [x]
        )
        study.tell(trial, [x, 1 - x])
    return study


def _assert_same_as_optunas_storage(url: str, name: str) -> None:
    stored = optuna.load_study(study_name=name, storage=optuna_storage(url, read_only=True))
    record = read_study(url, name)
    assert record.name == name
    assert record.directions == stored.directions
    assert record.metric_names == stored.metric_names
    expected = stored.get_trials(deepcopy=False)
    assert len(record.trials) == len(expected) > 0
    for mine, theirs in zip(record.trials, expected, strict=True):
        assert isinstance(mine, optuna.trial.FrozenTrial)
        assert (mine.number, mine.state, mine.params, mine.distributions) == (
            theirs.number,
            theirs.state,
            theirs.params,
            theirs.distributions,
        )
        assert (mine.datetime_start, mine.datetime_complete) == (
            theirs.datetime_start,
            theirs.datetime_complete,
        )
        # NaN is not equal to itself: compare the values' text.
        assert repr(mine.values) == repr(theirs.values)
        assert repr(mine.intermediate_values) == repr(theirs.intermediate_values)
        assert mine.system_attrs.get("constraints") == theirs.system_attrs.get("constraints")
    assert [t.number for t in record.trials] == list(range(len(expected)))


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'slotsweep.db'}"
    upgrade_schema(url)
    return url


def test_read_study_is_what_optunas_storage_reads(db_url: str) -> None:
    _searched_study(db_url, "single")
    _multi_objective_study(db_url, "multi")
    _assert_same_as_optunas_storage(db_url, "single")
    _assert_same_as_optunas_storage(db_url, "multi")
    assert read_study(db_url, "multi").trials[2].system_attrs == {"constraints": [0.3]}
    with pytest.raises(KeyError, match="no-such-study"):
        read_study(db_url, "no-such-study")


def test_study_trials_and_trial_ids_through_optunas_public_storage(db_url: str) -> None:
    _searched_study(db_url, "single")
    everything = study_trials(db_url, "single")
    assert everything is not None
    assert [t.state.name for t in everything] == [
        *["COMPLETE"] * 4,
        "PRUNED",
        "FAIL",
        "RUNNING",
        "WAITING",
    ]
    open_states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    opened = study_trials(db_url, "single", states=open_states)
    assert opened is not None and [t.number for t in opened] == [6, 7]
    assert study_trials(db_url, "no-such-study") is None
    storage = optuna_storage(db_url, read_only=True)
    for trial in everything:
        assert storage.get_trial(optuna_trial_id(db_url, "single", trial.number)).number == (
            trial.number
        )


def test_a_database_without_optunas_tables_has_no_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'slotsweep.db'}"
    upgrade_schema(url)  # slotsweep's tables only; its Alembic table has its own name.
    with get_engine(url, read_only=True).connect() as conn:
        assert optuna_schema_revision(conn) is None
    assert not study_signature(url, "any").exists
    assert study_trials(url, "any") is None
    with pytest.raises(KeyError):
        read_study(url, "any")


def test_study_signature_changes_when_the_study_does(db_url: str) -> None:
    _searched_study(db_url, "single")
    name = "single"
    engine = get_engine(db_url, read_only=True)
    before = study_signature(engine, name)
    assert before.exists and before.trials == 8 and before.objectives == 1
    assert not study_signature(engine, "no-such-study").exists
    study = optuna.load_study(study_name=name, storage=optuna_storage(db_url))
    trial = study.ask()
    asked = study_signature(engine, name)
    assert asked.everything != before.everything
    trial.report(0.5, 1)
    reported = study_signature(engine, name)
    assert reported.everything != asked.everything
    # Plots of completed trials need not be redrawn until a trial completes.
    assert reported.completed == asked.completed == before.completed
    study.tell(trial, 0.5)
    told = study_signature(db_url, name)
    assert told.everything != reported.everything
    assert told.completed != before.completed
    _multi_objective_study(db_url, "multi")
    assert study_signature(db_url, "multi").objectives == 2


def test_optunas_tables_at_an_unknown_revision_are_refused_in_one_line(db_url: str) -> None:
    _searched_study(db_url, "single")
    with get_engine(db_url, read_only=True).connect() as conn:
        assert optuna_schema_revision(conn) in KNOWN_OPTUNA_SCHEMAS
    with get_engine(db_url).begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'v9.0.0.a'"))
    for read in (study_signature, read_study):
        with pytest.raises(OptunaSchemaError) as refused:
            read(db_url, "single")
        message = str(refused.value)
        assert "\n" not in message
        assert "v9.0.0.a" in message
        assert all(known in message for known in KNOWN_OPTUNA_SCHEMAS)


@pytest.mark.slow
def test_the_gateway_reads_a_study_on_postgresql(postgres_url: str) -> None:
    upgrade_schema(postgres_url)
    _searched_study(postgres_url, "single")
    _multi_objective_study(postgres_url, "multi")
    _assert_same_as_optunas_storage(postgres_url, "single")
    _assert_same_as_optunas_storage(postgres_url, "multi")
    signature = study_signature(postgres_url, "single")
    assert signature.exists and signature.trials == 8


def test_rows_optuna_would_not_number_so_are_read_through_optunas_storage(db_url: str) -> None:
    _searched_study(db_url, "single")
    gone = optuna_trial_id(db_url, "single", 2)
    with get_engine(db_url).begin() as conn:
        for table in (
            "trial_params",
            "trial_values",
            "trial_intermediate_values",
            "trial_system_attributes",
            "trial_user_attributes",
            "trials",
        ):
            conn.execute(sa.text(f"DELETE FROM {table} WHERE trial_id = :t"), {"t": gone})
    record = read_study(db_url, "single")
    assert [t.number for t in record.trials] == [0, 1, 3, 4, 5, 6, 7]
    assert record.trials[2].values == [0.125]


def _holding_the_write_lock(url: str, read: Callable[[], object], *, hold_s: float = 10.0) -> bool:
    """Whether ``read()`` returns while another connection holds SQLite's write lock.

    The lock is held until ``read`` returns, or for ``hold_s``: a read that waited for
    the writer would only return once it let go.
    """
    path = sa.engine.make_url(url).database
    assert path is not None
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    done = threading.Event()
    reader = threading.Thread(target=lambda: (read(), done.set()), daemon=True)
    reader.start()
    returned = done.wait(timeout=hold_s)
    writer.execute("ROLLBACK")
    writer.close()
    reader.join(timeout=60.0)
    return returned


def test_optunas_reads_never_wait_for_a_writer(db_url: str) -> None:
    # A study's trials are read (by the sampler, the pruner, the UI) while the trials'
    # ranks write: the reads run in deferred transactions and take no write lock.
    study = _searched_study(db_url, "reads")
    storage = optuna_storage(db_url)
    study_id = storage.get_study_id_from_name("reads")
    expected = len(study.trials)
    counts: list[int] = []
    assert _holding_the_write_lock(
        db_url, lambda: counts.append(len(storage.get_all_trials(study_id)))
    )
    assert _holding_the_write_lock(
        db_url,
        lambda: counts.append(len(optuna.load_study(study_name="reads", storage=storage).trials)),
    )
    assert counts == [expected, expected]
    # A write still takes the lock up front, and waits for it.
    assert not _holding_the_write_lock(db_url, lambda: study.ask(), hold_s=1.0)


def test_optunas_writes_in_the_block_commit_together_or_not_at_all(db_url: str) -> None:
    storage = optuna_storage(db_url)
    study = optuna.create_study(study_name="together", storage=storage)
    trial = study.ask()
    with optuna_writes_together(storage):
        trial.suggest_int("x", 0, 9)
        trial.suggest_categorical("c", ["a", "b"])
        # Not committed yet: another connection does not see them.
        other = sa.create_engine(db_url)
        with other.connect() as connection:
            params = connection.execute(sa.text("select count(*) from trial_params")).scalar()
        other.dispose()
        assert params == 0
        # Another thread's Optuna sessions stay on their own transactions.
        binds: list[object] = []
        other_thread = threading.Thread(
            target=lambda: binds.append(storage.scoped_session().get_bind())
        )
        other_thread.start()
        other_thread.join()
        assert binds == [storage.engine]
    assert set(study.trials[-1].params) == {"x", "c"}

    failed = study.ask()
    with (
        pytest.raises(RuntimeError, match="between the suggestions"),
        optuna_writes_together(storage),
    ):
        failed.suggest_int("x", 0, 9)
        raise RuntimeError("between the suggestions")
    assert study.trials[-1].params == {}
    # Outside the block, Optuna commits each write on its own again.
    later = study.ask()
    later.suggest_int("x", 0, 9)
    study.tell(later, 1.0)
    assert study.trials[-1].params.keys() == {"x"}
