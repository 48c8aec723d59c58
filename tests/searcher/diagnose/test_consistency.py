"""The consistency check on databases written by hand: one consistent, then one break each.

The consistent search (experiment COMPLETED, hyperparameters ``lr`` searched and
``lr_scaling`` constant) has three trials on agent ``a``:

- trial 0, COMPLETED (0.5): attempt 0 on slots 0-1 from 1 s to 10 s with a checkpoint at
  step 10 (8 s), attempt 1 restored from it, 12 s to 20 s;
- trial 1, PRUNED: one attempt on slot 0 from 21 s to 30 s;
- trial 2, ERROR: one attempt on slots 2-3 from 0 s to 25 s.

Each test changes one thing and asserts that exactly that problem is reported.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from sqlalchemy import select, text, update

from searcher import check_consistency
from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    MetricKind,
    ProcessRole,
    Timing,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    optuna_storage,
    record_metrics,
    session_scope,
)
from tests.conftest import add_experiment

T0 = dt.datetime(2026, 1, 1)
SPACE = {
    "lr": {"type": "log", "minval": 1e-4, "maxval": 0.1, "count": None},
    "lr_scaling": {"type": "const", "val": "linear"},
}
LR = {"lr": FloatDistribution(1e-4, 0.1, log=True)}


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@dataclass(frozen=True)
class Search:
    url: str
    experiment_id: int
    study_name: str
    trial_ids: list[int]
    checkpoint_uuid: str


def _add_run(
    url: str,
    trial_id: int,
    attempt: int,
    start: float,
    end: float | None,
    slots: list[int],
    **fields: Any,
) -> int:
    """A run with its torchrun and one rank per slot, all alive from ``start`` to ``end``."""
    ended = None if end is None else _at(end)
    with session_scope(url) as session:
        run = TrialRun(
            trial_id=trial_id, attempt=attempt, started_at=_at(start), ended_at=ended, **fields
        )
        session.add(run)
        session.flush()
        common = {
            "run_id": run.id,
            "trial_id": trial_id,
            "attempt": attempt,
            "agent": "a",
            "host": "127.0.0.1",
            "started_at": _at(start),
            "ended_at": ended,
        }
        pid = 1000 * trial_id + 100 * attempt
        session.add(
            TrialProcess(
                **common, role=ProcessRole.TORCHRUN, slots=slots, pid=pid, create_time=start
            )
        )
        session.add_all(
            TrialProcess(
                **common,
                role=ProcessRole.RANK,
                slots=[slot],
                rank=rank,
                local_rank=rank,
                pid=pid + rank + 1,
                create_time=start,
            )
            for rank, slot in enumerate(slots)
        )
        return run.id


def _add_checkpoint(url: str, trial_id: int, step: int, created: float) -> str:
    uuid = f"ckpt-{trial_id}-{step}-{created}"
    with session_scope(url) as session:
        session.add(
            Checkpoint(
                uuid=uuid,
                trial_id=trial_id,
                step=step,
                path=f"/checkpoints/{uuid}",
                state=CheckpointState.COMPLETED,
                created_at=_at(created),
            )
        )
    return uuid


def _set(url: str, model: Any, where: Any, **values: Any) -> None:
    with session_scope(url) as session:
        session.execute(update(model).where(where).values(**values))


@pytest.fixture
def search(db_url: str) -> Search:
    experiment_id, trial_ids = add_experiment(
        db_url,
        [
            {
                "state": TrialState.COMPLETED,
                "hparams": {"lr": 0.01, "lr_scaling": "linear"},
                "searcher_metric_value": 0.5,
                "finished_at": _at(19),
                "restarts": 1,
            },
            {"state": TrialState.PRUNED, "hparams": {"lr": 0.02, "lr_scaling": "linear"}},
            {"state": TrialState.ERROR, "hparams": {"lr": 0.03, "lr_scaling": "linear"}},
        ],
        state=ExperimentState.COMPLETED,
    )
    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        experiment.config = {"hyperparameters": SPACE}
        study_name = experiment.study_name
    study = optuna.create_study(study_name=study_name, storage=optuna_storage(db_url))
    study.add_trial(optuna.trial.create_trial(params={"lr": 0.01}, distributions=LR, value=0.5))
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 0.02}, distributions=LR, state=optuna.trial.TrialState.PRUNED
        )
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 0.03}, distributions=LR, state=optuna.trial.TrialState.FAIL
        )
    )

    first, pruned, failed = trial_ids
    _add_run(db_url, first, 0, 1, 10, [0, 1], exit_code=1, reason="rank 1 died")
    uuid = _add_checkpoint(db_url, first, 10, 8)
    _add_run(
        db_url,
        first,
        1,
        12,
        20,
        [0, 1],
        exit_code=0,
        restored_from_checkpoint=uuid,
        restored_from_step=10,
    )
    _add_checkpoint(db_url, first, 20, 18)
    _add_run(db_url, pruned, 0, 21, 30, [0], exit_code=0)
    _add_run(db_url, failed, 0, 0, 25, [2, 3], exit_code=1)
    for trial_id in trial_ids:
        for step in (10, 20):
            with session_scope(db_url) as session:
                record_metrics(session, trial_id, step, MetricKind.TRAINING, {"loss": 1.0 / step})
        with session_scope(db_url) as session:
            record_metrics(session, trial_id, 20, MetricKind.VALIDATION, {"val_loss": 0.5})
    return Search(db_url, experiment_id, study_name, trial_ids, uuid)


def _problems(search: Search) -> list[str]:
    return check_consistency(search.url).problems


def test_a_consistent_search_has_no_problems(search: Search) -> None:
    report = check_consistency(search.url)
    assert report.problems == []
    assert report.consistent and report.overlaps == 0
    assert (report.experiments, report.trials, report.finished_trials) == (1, 3, 3)
    assert (report.runs, report.restarts, report.checkpoints) == (4, 1, 2)
    assert report.processes == 4 + 7
    assert report.metrics == 9
    assert "overlaps=0 problems=0" in report.summary()


def test_a_state_that_differs_from_optuna(search: Search) -> None:
    _set(search.url, Trial, Trial.id == search.trial_ids[1], state=TrialState.ERROR)
    (problem,) = _problems(search)
    assert f"trial {search.trial_ids[1]}: ERROR" in problem
    assert "is PRUNED (expected FAIL)" in problem


def test_a_value_that_differs_from_optuna(search: Search) -> None:
    _set(search.url, Trial, Trial.id == search.trial_ids[0], searcher_metric_value=0.25)
    (problem,) = _problems(search)
    assert "searcher metric 0.25 but Optuna trial 0 has value [0.5]" in problem


@pytest.mark.parametrize(
    ("field", "what"),
    [("finished_at", "completion record"), ("searcher_metric_value", "searcher metric value")],
)
def test_a_completed_trial_without_its_record(search: Search, field: str, what: str) -> None:
    _set(search.url, Trial, Trial.id == search.trial_ids[0], **{field: None})
    assert _problems(search) == [f"trial {search.trial_ids[0]}: COMPLETED without a {what}"]


def test_a_finished_trial_unknown_to_optuna(search: Search) -> None:
    (trial_id,) = add_experiment(search.url, [{}])[1]
    _set(
        search.url,
        Trial,
        Trial.id == trial_id,
        experiment_id=search.experiment_id,
        optuna_trial_number=7,
        state=TrialState.PRUNED,
    )
    (problem,) = check_consistency(search.url, [search.experiment_id]).problems
    assert problem.startswith(f"trial {trial_id}: PRUNED but Optuna has no trial number 7")


def test_an_optuna_trial_without_its_slotsweep_trial(search: Search) -> None:
    study = optuna.load_study(study_name=search.study_name, storage=optuna_storage(search.url))
    study.add_trial(optuna.trial.create_trial(params={"lr": 0.04}, distributions=LR, value=0.7))
    assert _problems(search) == [
        f"experiment {search.experiment_id}: Optuna trial 3 is COMPLETE but has no slotsweep trial"
    ]


def test_an_optuna_trial_completed_without_its_hyperparameters(search: Search) -> None:
    # Asked, never given its values, and run anyway: the crash in the issue.
    study = optuna.load_study(study_name=search.study_name, storage=optuna_storage(search.url))
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.7))
    with session_scope(search.url) as session:
        session.add(
            Trial(
                experiment_id=search.experiment_id,
                optuna_trial_id=3,
                optuna_trial_number=3,
                state=TrialState.COMPLETED,
                hparams={"lr_scaling": "linear"},
                slots_per_trial=1,
                searcher_metric_value=0.7,
                finished_at=_at(40),
            )
        )
    assert _problems(search) == [
        f"experiment {search.experiment_id}: Optuna trial 3 is COMPLETE without hyperparameters lr"
    ]


def test_a_missing_study(search: Search) -> None:
    _set(search.url, Experiment, Experiment.id == search.experiment_id, study_name="gone")
    assert _problems(search) == [
        f"experiment {search.experiment_id}: its Optuna study 'gone' is missing"
    ]


def test_a_metric_recorded_twice(search: Search) -> None:
    # The unique key forbids this; a copy of the table without it (as a hand-made or
    # damaged database might have) shows that the check does not rely on it.
    with session_scope(search.url) as session:
        session.execute(text("CREATE TABLE m AS SELECT * FROM slotsweep_metrics"))
        session.execute(text("DROP TABLE slotsweep_metrics"))
        session.execute(text("ALTER TABLE m RENAME TO slotsweep_metrics"))
        session.execute(
            text(
                "INSERT INTO slotsweep_metrics (id, trial_id, step, kind, name, value, "
                "recorded_at) SELECT id + 1000, trial_id, step, kind, name, value, recorded_at "
                "FROM slotsweep_metrics WHERE trial_id = :t AND step = 10"
            ),
            {"t": search.trial_ids[2]},
        )
    assert _problems(search) == [
        f"trial {search.trial_ids[2]}: metric training 'loss' at step 10 recorded 2 times"
    ]


def test_a_timing_window_recorded_twice(search: Search) -> None:
    # Two attempts profiling the same steps at once, as the orphaned ranks in issue 13 did.
    window = {"name": "train_batch", "start_step": 1, "end_step": 10, "count": 10}
    figures = {"mean_s": 0.1, "p50_s": 0.1, "p95_s": 0.2, "total_s": 1.0}
    with session_scope(search.url) as session:
        session.add_all(
            Timing(trial_id=search.trial_ids[0], **window, **figures) for _ in range(2)
        )
    assert _problems(search) == [
        f"trial {search.trial_ids[0]}: timing 'train_batch' of steps 1-10 recorded 2 times"
    ]


def test_two_checkpoints_at_one_step(search: Search) -> None:
    _add_checkpoint(search.url, search.trial_ids[0], 20, 19)
    assert _problems(search) == [f"trial {search.trial_ids[0]}: 2 checkpoints at step 20"]


def test_a_restart_from_step_zero_despite_a_checkpoint(search: Search) -> None:
    _set(
        search.url,
        TrialRun,
        (TrialRun.trial_id == search.trial_ids[0]) & (TrialRun.attempt == 1),
        restored_from_checkpoint=None,
        restored_from_step=None,
    )
    assert _problems(search) == [
        f"trial {search.trial_ids[0]}: attempt 1 started from step 0 although 1 "
        "checkpoint(s) existed before it"
    ]


def test_a_restart_before_any_checkpoint_may_start_from_zero(search: Search) -> None:
    _set(search.url, Checkpoint, Checkpoint.step == 10, created_at=_at(13))
    _set(
        search.url,
        TrialRun,
        (TrialRun.trial_id == search.trial_ids[0]) & (TrialRun.attempt == 1),
        restored_from_checkpoint=None,
    )
    assert _problems(search) == []


@pytest.mark.parametrize(
    ("ended_at", "what"), [(None, "its run never ended"), (_at(13), "its run ended at")]
)
def test_attempt_runs_that_overlap(search: Search, ended_at: Any, what: str) -> None:
    _set(
        search.url,
        TrialRun,
        (TrialRun.trial_id == search.trial_ids[0]) & (TrialRun.attempt == 0),
        ended_at=ended_at,
    )
    report = check_consistency(search.url)
    (problem,) = report.problems
    assert problem.startswith(f"trial {search.trial_ids[0]}: attempt 0 overlaps attempt 1")
    assert what in problem and report.overlaps == 1


def test_a_rank_of_an_earlier_attempt_that_never_ended(search: Search) -> None:
    trial_id = search.trial_ids[0]
    _set(
        search.url,
        TrialProcess,
        (TrialProcess.trial_id == trial_id)
        & (TrialProcess.attempt == 0)
        & (TrialProcess.rank == 1),
        ended_at=None,
    )
    report = check_consistency(search.url)
    (problem,) = report.problems
    assert f"attempt 0 overlaps attempt 1 (started {_at(12)})" in problem
    assert f"rank 1 (pid {1000 * trial_id + 2}) of trial {trial_id} attempt 0 never ended" in (
        problem
    )
    assert report.overlaps == 1


def test_an_orphaned_rank_also_holds_its_slot_against_other_trials(search: Search) -> None:
    # Rank 0 of trial 0's first attempt on slot 0, never ended: trial 1 later ran there.
    first, pruned, _ = search.trial_ids
    _set(
        search.url,
        TrialProcess,
        (TrialProcess.trial_id == first) & (TrialProcess.attempt == 0) & (TrialProcess.rank == 0),
        ended_at=None,
    )
    report = check_consistency(search.url)
    assert report.overlaps == 2
    attempt, slot = report.problems
    assert attempt.startswith(f"trial {first}: attempt 0 overlaps attempt 1")
    assert slot.startswith("slot 0 of agent 'a': rank 0")
    assert f"of trial {first} attempt 0 and rank 0" in slot
    assert f"of trial {pruned} attempt 0 held it at the same time" in slot


def test_two_trials_on_one_slot(search: Search) -> None:
    pruned = search.trial_ids[1]
    _set(search.url, TrialProcess, TrialProcess.trial_id == pruned, started_at=_at(19))
    report = check_consistency(search.url)
    assert report.problems == [
        f"slot 0 of agent 'a': rank 0 (pid {1000 * search.trial_ids[0] + 101}) of trial "
        f"{search.trial_ids[0]} attempt 1 and rank 0 (pid {1000 * pruned + 1}) of trial "
        f"{pruned} attempt 0 held it at the same time (from {_at(19)})"
    ]
    assert report.overlaps == 1


def test_a_slot_handed_over_at_the_same_instant_is_not_shared(search: Search) -> None:
    _set(
        search.url, TrialProcess, TrialProcess.trial_id == search.trial_ids[1], started_at=_at(20)
    )
    assert _problems(search) == []


def test_a_trial_left_running_in_a_finished_experiment(search: Search) -> None:
    with session_scope(search.url) as session:
        trial = Trial(
            experiment_id=search.experiment_id,
            optuna_trial_id=3,
            optuna_trial_number=3,
            state=TrialState.QUEUED,
            hparams={},
            slots_per_trial=1,
        )
        session.add(trial)
        session.flush()
        trial_id = trial.id
    assert _problems(search) == [
        f"trial {trial_id}: QUEUED in experiment {search.experiment_id}, which is COMPLETED"
    ]
    _set(search.url, Experiment, Experiment.id == search.experiment_id, state="PAUSED")
    assert _problems(search) == []


def test_only_the_chosen_experiments_are_checked(search: Search) -> None:
    other, (trial_id,) = add_experiment(search.url, [{}], state=ExperimentState.CANCELED)
    with session_scope(search.url) as session:
        study = session.get(Experiment, other).study_name  # type: ignore[union-attr]
    assert check_consistency(search.url, [search.experiment_id]).consistent
    everything = check_consistency(search.url)
    assert everything.problems == [
        f"experiment {other}: its Optuna study '{study}' is missing",
        f"trial {trial_id}: RUNNING in experiment {other}, which is CANCELED",
    ]
    assert everything.experiments == 2


def test_an_empty_database_is_consistent(db_url: str) -> None:
    report = check_consistency(db_url)
    assert report.consistent and report.trials == 0


def test_metrics_of_other_trials_are_not_counted(search: Search) -> None:
    with session_scope(search.url) as session:
        rows = session.scalars(select(Metric).where(Metric.trial_id == search.trial_ids[0]))
        assert len(list(rows)) == 3
    assert check_consistency(search.url, []).metrics == 0


def test_the_torchrun_of_a_run_whose_ranks_were_fenced_at_start_is_no_overlap(
    search: Search,
) -> None:
    # Attempt 0 was judged gone before its driver (stopped) started it; started after
    # all, its ranks exited at their first check and its torchrun was never seen ending.
    trial_id = search.trial_ids[0]
    attempt_0 = (TrialProcess.trial_id == trial_id) & (TrialProcess.attempt == 0)
    with session_scope(search.url) as session:
        for row in session.scalars(select(TrialProcess).where(attempt_0)):
            if row.role == ProcessRole.RANK:
                session.delete(row)
    _set(search.url, TrialProcess, attempt_0, ended_at=None, started_at=_at(13))
    first_run = (TrialRun.trial_id == trial_id) & (TrialRun.attempt == 0)
    _set(search.url, TrialRun, first_run, claim_token="claim-0")
    assert _problems(search) == []
    # A rank of it passed the check: its torchrun counts again.
    _set(search.url, TrialRun, first_run, ranks_started_at=_at(13))
    (problem,) = _problems(search)
    assert f"torchrun (pid {1000 * trial_id}) of trial {trial_id} attempt 0 never ended" in problem


def _share_search(search: Search, share: float, trials: int, start: float) -> list[int]:
    """A second experiment on ``share`` of a slot: ``trials`` trials on slot 3 of agent ``a``
    (where trial 2 of the fixture held slots 2-3 until 25 s), running at once from ``start``."""
    experiment_id, trial_ids = add_experiment(
        search.url, [{"state": TrialState.RUNNING}] * trials, name="shares"
    )
    _set(
        search.url,
        Experiment,
        Experiment.id == experiment_id,
        config={"resources": {"slots_per_trial": share}},
    )
    for trial_id in trial_ids:
        _add_run(search.url, trial_id, 0, start, start + 5, [3])
    return trial_ids


def test_shares_of_a_slot_within_its_capacity_are_no_overlap(search: Search) -> None:
    _share_search(search, 0.25, 4, start=30)
    with session_scope(search.url) as session:
        session.execute(update(Experiment).values(state=ExperimentState.ACTIVE))
    assert check_consistency(search.url).overlaps == 0


def test_shares_adding_up_to_more_than_a_slot_overlap(search: Search) -> None:
    halves = _share_search(search, 0.5, 3, start=30)
    report = check_consistency(search.url)
    assert report.overlaps == 1
    (problem,) = [p for p in report.problems if p.startswith("slot 3")]
    assert f"of trial {halves[2]} attempt 0 held it at the same time" in problem
    assert problem.endswith("(12 eighths of its 8)")


def test_a_share_beside_a_whole_trial_overlaps(search: Search) -> None:
    # Trial 2 of the fixture holds slots 2-3 whole until 25 s; a quarter starts at 24 s.
    (quarter,) = _share_search(search, 0.25, 1, start=24)
    report = check_consistency(search.url)
    assert report.overlaps == 1
    (problem,) = [p for p in report.problems if p.startswith("slot 3")]
    assert f"of trial {search.trial_ids[2]} attempt 0 and rank 0" in problem
    assert f"of trial {quarter} attempt 0 held it at the same time" in problem
    assert problem.endswith("(10 eighths of its 8)")
