"""The whole-database consistency check behind "a crash loses nothing; nothing runs twice".

:func:`check_consistency` reads slotsweep's tables and the Optuna studies beside them
and lists every way they break that promise:

- a finished trial not kept: a terminal slotsweep trial whose Optuna trial does not say
  the same (COMPLETED <-> COMPLETE with the same value, PRUNED <-> PRUNED, ERROR <->
  FAIL), a COMPLETED trial without its completion record or searcher metric, an Optuna
  trial COMPLETE or PRUNED without its slotsweep trial, or an Optuna COMPLETE trial
  missing one of the search space's hyperparameters (it ran with part of its settings);
- a metric key (trial, step, kind, name) recorded twice, a profiling window (trial, name,
  start and end step) recorded twice, or two checkpoints of one trial at one step (two
  attempts trained the same steps; a damaged checkpoint, or one an attempt fell back
  past, does not count);
- a restart from an earlier step (step 0 included) although the trial had a usable
  checkpoint of a later step before the restart began;
- two attempts of one trial overlapping in time (runs, or their processes; the
  ``torchrun`` of a run whose ranks were fenced at their start used nothing, and is no
  overlap);
- one slot used by the ranks of two trials at once, beyond its capacity: two whole-slot
  trials, or trials on shares of it whose shares add up to more than one slot;
- a trial left QUEUED or RUNNING in a COMPLETED or CANCELED experiment.

It only reads (deferred transactions, Optuna's storage opened read-only), so it can run
beside a live search; a database at rest (no driver running) is what it judges, since a
running driver has trials between its commit and its tell to Optuna.

Example:
    >>> report = check_consistency(url)
    >>> report.consistent, report.overlaps
    (True, 0)
    >>> report.summary()
    'experiments=1 trials=1 finished=0 runs=0 restarts=0 processes=0 metrics=0 checkpoints=0 overlaps=0 problems=0'
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.selectable import ScalarSelect

from storage import (
    Checkpoint,
    CheckpointState,
    Experiment,
    ExperimentState,
    Metric,
    ProcessRole,
    Timing,
    Trial,
    TrialProcess,
    TrialRun,
    TrialState,
    get_engine,
    session_scope,
    study_trials,
    utcnow,
)
from trials.config import (
    EIGHTHS_PER_SLOT,
    StoredConfigError,
    read_stored_hyperparameters,
    read_stored_resources,
    slot_eighths,
)
from trials.launch.processes import ProcessRef

# The Optuna state each terminal slotsweep state must have (by Optuna's state name).
_OPTUNA_STATE = {
    TrialState.COMPLETED: "COMPLETE",
    TrialState.PRUNED: "PRUNED",
    TrialState.ERROR: "FAIL",
    TrialState.NOT_RUN: "FAIL",
}
# Experiments that will never run a trial again; their trials must all be terminal.
_CLOSED = (ExperimentState.COMPLETED, ExperimentState.CANCELED)
# A process row's start is the kernel's, counted in clock ticks (1/100 s on Linux): up
# to a tick early. A process that started within a tick of another's recorded end is
# not taken to overlap it.
_START_RESOLUTION = dt.timedelta(seconds=0.01)


@dataclass
class ConsistencyReport:
    """What :func:`check_consistency` found: one line per problem, and what it looked at.

    ``overlaps`` counts both kinds of overlap (two attempts of one trial, two trials on
    one slot); each is also a line of ``problems``. ``restarts`` counts relaunches of a
    trial (runs with ``attempt > 0``), whatever ended the run before.
    """

    problems: list[str] = field(default_factory=list)
    experiments: int = 0
    trials: int = 0
    finished_trials: int = 0
    runs: int = 0
    restarts: int = 0
    processes: int = 0
    metrics: int = 0
    checkpoints: int = 0
    overlaps: int = 0

    @property
    def consistent(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line of counts, e.g. for a benchmark's or a test's output."""
        return (
            f"experiments={self.experiments} trials={self.trials} "
            f"finished={self.finished_trials} runs={self.runs} restarts={self.restarts} "
            f"processes={self.processes} metrics={self.metrics} "
            f"checkpoints={self.checkpoints} overlaps={self.overlaps} "
            f"problems={len(self.problems)}"
        )


def check_consistency(
    db_url: str, experiment_ids: Collection[int] | None = None
) -> ConsistencyReport:
    """Check the experiments ``experiment_ids`` (default: all) of the database at ``db_url``.

    Slot overlaps are looked for across every experiment of the database whatever
    ``experiment_ids`` says (two searches share a cluster), but only those involving a
    chosen experiment's trial are reported.
    """
    report = ConsistencyReport()
    with session_scope(get_engine(db_url, read_only=True)) as session:
        query = select(Experiment).order_by(Experiment.id)
        if experiment_ids is not None:
            query = query.where(Experiment.id.in_(list(experiment_ids)))
        experiments = list(session.scalars(query))
        chosen = {e.id for e in experiments}
        trials = list(
            session.scalars(
                select(Trial).where(Trial.experiment_id.in_(chosen)).order_by(Trial.id)
            )
        )
        # A subquery rather than a list of ids: a large database has more trials than a
        # statement may have parameters.
        trial_ids = select(Trial.id).where(Trial.experiment_id.in_(chosen)).scalar_subquery()
        runs = list(
            session.scalars(
                select(TrialRun)
                .where(TrialRun.trial_id.in_(trial_ids))
                .order_by(TrialRun.trial_id, TrialRun.attempt)
            )
        )
        processes = list(
            session.scalars(
                select(TrialProcess)
                .join(Trial, Trial.id == TrialProcess.trial_id)
                .where(Trial.experiment_id.in_(chosen))
                .order_by(TrialProcess.id)
            )
        )
        checkpoints = list(
            session.scalars(
                select(Checkpoint)
                .where(Checkpoint.trial_id.in_(trial_ids))
                .order_by(Checkpoint.trial_id, Checkpoint.step, Checkpoint.id)
            )
        )
        report.experiments = len(experiments)
        report.trials = len(trials)
        report.finished_trials = sum(t.state.is_terminal for t in trials)
        report.runs = len(runs)
        report.restarts = sum(r.attempt > 0 for r in runs)
        report.processes = len(processes)
        report.checkpoints = len(checkpoints)
        report.metrics = int(
            session.scalar(
                select(func.count()).select_from(Metric).where(Metric.trial_id.in_(trial_ids))
            )
            or 0
        )

        for experiment in experiments:
            own = [t for t in trials if t.experiment_id == experiment.id]
            report.problems += _optuna_problems(db_url, experiment, own)
            report.problems += _closed_experiment_problems(experiment, own)
        report.problems += _completion_problems(trials)
        report.problems += _duplicate_metric_problems(session, trial_ids)
        report.problems += _duplicate_timing_problems(session, trial_ids)
        report.problems += _duplicate_checkpoint_problems(checkpoints, runs)
        report.problems += _restart_problems(runs, checkpoints)
        attempt_overlaps = _attempt_overlaps(runs, processes)
        slot_overlaps = _slot_overlaps(session, {t.id for t in trials})
        report.overlaps = len(attempt_overlaps) + len(slot_overlaps)
        report.problems += attempt_overlaps + slot_overlaps
    return report


# ----------------------------------------------------------------- finished trials kept
def _optuna_problems(db_url: str, experiment: Experiment, trials: Sequence[Trial]) -> list[str]:
    """Each terminal trial against its Optuna trial, and Optuna's finished trials against ours."""
    study = study_trials(db_url, experiment.study_name)
    if study is None:
        if not trials:
            # A crash between the experiment row and its study leaves an empty experiment.
            return []
        return [
            f"experiment {experiment.id}: its Optuna study '{experiment.study_name}' is missing"
        ]
    by_number = {t.number: t for t in study}
    problems = []
    for trial in trials:
        expected = _OPTUNA_STATE.get(trial.state)
        if expected is None:
            continue
        frozen = by_number.get(trial.optuna_trial_number)
        if frozen is None:
            problems.append(
                f"trial {trial.id}: {trial.state.value} but Optuna has no trial number "
                f"{trial.optuna_trial_number} in study '{experiment.study_name}'"
            )
            continue
        if frozen.state.name != expected:
            problems.append(
                f"trial {trial.id}: {trial.state.value} but Optuna trial "
                f"{frozen.number} is {frozen.state.name} (expected {expected})"
            )
        elif (
            expected == "COMPLETE"
            # A missing value is reported by _completion_problems.
            and trial.searcher_metric_value is not None
            and not _same_value(
                frozen.values[0] if frozen.values else None, trial.searcher_metric_value
            )
        ):
            problems.append(
                f"trial {trial.id}: searcher metric {trial.searcher_metric_value} but Optuna "
                f"trial {frozen.number} has value {frozen.values}"
            )
    ours = {t.optuna_trial_number for t in trials}
    searched = _searched_hyperparameters(experiment.config)
    if searched is None:
        problems.append(f"experiment {experiment.id}: its stored hyperparameters do not parse")
        searched = set()
    for frozen in study:
        if frozen.state.name in ("COMPLETE", "PRUNED") and frozen.number not in ours:
            problems.append(
                f"experiment {experiment.id}: Optuna trial {frozen.number} is "
                f"{frozen.state.name} but has no slotsweep trial"
            )
        if frozen.state.name == "COMPLETE":
            missing = sorted(searched - set(frozen.params))
            if missing:
                problems.append(
                    f"experiment {experiment.id}: Optuna trial {frozen.number} is COMPLETE "
                    f"without hyperparameters {', '.join(missing)}"
                )
    return problems


def _searched_hyperparameters(stored_config: Any) -> set[str] | None:
    """The names Optuna suggests: the stored space's non-constant hyperparameters.

    Parsed with the config's own types and :func:`searcher.submit.space.distributions`, so what
    counts as searched is decided in one place. None when the stored space does not parse.
    """
    from searcher.submit.space import distributions

    try:
        return set(distributions(read_stored_hyperparameters(stored_config)))
    except StoredConfigError:
        return None


def _same_value(optuna_value: float | None, ours: float) -> bool:
    if optuna_value is None:
        return False
    return math.isclose(optuna_value, ours, rel_tol=1e-9, abs_tol=1e-12)


def _completion_problems(trials: Iterable[Trial]) -> list[str]:
    problems = []
    for trial in trials:
        if trial.state != TrialState.COMPLETED:
            continue
        if trial.finished_at is None:
            problems.append(f"trial {trial.id}: COMPLETED without a completion record")
        if trial.searcher_metric_value is None:
            problems.append(f"trial {trial.id}: COMPLETED without a searcher metric value")
    return problems


def _closed_experiment_problems(experiment: Experiment, trials: Iterable[Trial]) -> list[str]:
    if experiment.state not in _CLOSED:
        return []
    return [
        f"trial {t.id}: {t.state.value} in experiment {experiment.id}, which is "
        f"{experiment.state.value}"
        for t in trials
        if not t.state.is_terminal
    ]


# ----------------------------------------------------------------- nothing recorded twice
def _duplicate_metric_problems(session: Session, trial_ids: ScalarSelect[int]) -> list[str]:
    rows = session.execute(
        select(Metric.trial_id, Metric.step, Metric.kind, Metric.name, func.count())
        .where(Metric.trial_id.in_(trial_ids))
        .group_by(Metric.trial_id, Metric.step, Metric.kind, Metric.name)
        .having(func.count() > 1)
        .order_by(Metric.trial_id, Metric.step, Metric.name)
    ).all()
    return [
        f"trial {trial_id}: metric {kind.value} '{name}' at step {step} recorded {count} times"
        for trial_id, step, kind, name, count in rows
    ]


def _duplicate_timing_problems(session: Session, trial_ids: ScalarSelect[int]) -> list[str]:
    key = (Timing.trial_id, Timing.name, Timing.start_step, Timing.end_step)
    rows = session.execute(
        select(*key, func.count())
        .where(Timing.trial_id.in_(trial_ids))
        .group_by(*key)
        .having(func.count() > 1)
        .order_by(*key)
    ).all()
    return [
        f"trial {trial_id}: timing '{name}' of steps {start}-{end} recorded {count} times"
        for trial_id, name, start, end, count in rows
    ]


def _duplicate_checkpoint_problems(
    checkpoints: Iterable[Checkpoint], runs: Sequence[TrialRun]
) -> list[str]:
    """Two live checkpoints of one trial at one step.

    A damaged (CORRUPTED) checkpoint, and one a later attempt abandoned (it restored an
    earlier step, or started over, because the newer ones were damaged), belong to a
    timeline the trial trained again: a new checkpoint at their step is no duplicate.
    """
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for checkpoint in checkpoints:
        if checkpoint.state == CheckpointState.CORRUPTED or _abandoned(checkpoint, runs):
            continue
        counts[checkpoint.trial_id, checkpoint.step] += 1
    return [
        f"trial {trial_id}: {count} checkpoints at step {step}"
        for (trial_id, step), count in counts.items()
        if count > 1
    ]


def _restored_step(run: TrialRun) -> int:
    """The step a restart continued from (0 when it restored nothing)."""
    if run.restored_from_checkpoint is None:
        return 0
    return run.restored_from_step or 0


def _abandoned(checkpoint: Checkpoint, runs: Sequence[TrialRun]) -> bool:
    """Whether a later attempt of its trial continued from an earlier step than it."""
    return any(
        run.trial_id == checkpoint.trial_id
        and run.attempt > 0
        and run.started_at > checkpoint.created_at
        and _restored_step(run) < checkpoint.step
        for run in runs
    )


def _restart_problems(runs: Iterable[TrialRun], checkpoints: Sequence[Checkpoint]) -> list[str]:
    """Relaunches that continued from an earlier step than a usable checkpoint before them.

    Usable: not damaged (CORRUPTED), and not one that retention deleted because a newer
    checkpoint, found damaged later, had been written (the restore then rightly fell
    back past it, or started over).
    """
    by_trial: dict[int, list[Checkpoint]] = defaultdict(list)
    for checkpoint in checkpoints:
        by_trial[checkpoint.trial_id].append(checkpoint)
    problems = []
    for run in runs:
        if run.attempt == 0:
            continue
        before = [c for c in by_trial[run.trial_id] if c.created_at < run.started_at]
        damaged = [c.created_at for c in before if c.state == CheckpointState.CORRUPTED]
        restored = _restored_step(run)
        usable = [
            c
            for c in before
            if c.step > restored
            and c.state != CheckpointState.CORRUPTED
            and not (
                c.state == CheckpointState.DELETED
                and any(moment > c.created_at for moment in damaged)
            )
        ]
        if not usable:
            continue
        if restored == 0:
            problems.append(
                f"trial {run.trial_id}: attempt {run.attempt} started from step 0 although "
                f"{len(usable)} checkpoint(s) existed before it"
            )
        else:
            problems.append(
                f"trial {run.trial_id}: attempt {run.attempt} continued from step {restored} "
                f"although {len(usable)} checkpoint(s) of later steps existed before it"
            )
    return problems


# ----------------------------------------------------------------- nothing runs twice at once
def _attempt_overlaps(runs: Sequence[TrialRun], processes: Iterable[TrialProcess]) -> list[str]:
    """Consecutive attempts of a trial where the earlier one had not ended when the next began.

    Both the run rows and the process rows are compared: the earlier attempt's processes
    must all have ended (an unset ``ended_at`` means "maybe still running") no later than
    the first process of the next attempt started, or than the next run's start when it
    recorded no process.
    """
    processes = list(processes)
    handed_on = _handed_on(processes)
    by_attempt: dict[tuple[int, int], list[TrialProcess]] = defaultdict(list)
    for process in processes:
        by_attempt[process.trial_id, process.attempt].append(process)
    by_trial: dict[int, list[TrialRun]] = defaultdict(list)
    for run in runs:
        by_trial[run.trial_id].append(run)
    problems = []
    for trial_id, attempts in by_trial.items():
        for earlier, later in itertools.pairwise(attempts):
            reasons = []
            if earlier.ended_at is None:
                reasons.append("its run never ended")
            elif earlier.ended_at > later.started_at:
                reasons.append(f"its run ended at {earlier.ended_at}")
            next_processes = by_attempt[trial_id, later.attempt]
            next_start = min(
                (_serving_since(p, later.started_at, handed_on) for p in next_processes),
                default=later.started_at,
            )
            for process in by_attempt[trial_id, earlier.attempt]:
                if any(_same_process(process, p) for p in next_processes):
                    continue  # one warm job's process, handed from one attempt to the next
                if _fenced_out(earlier, process):
                    continue
                if process.ended_at is None:
                    reasons.append(f"{_describe(process)} never ended")
                elif process.ended_at > next_start + _START_RESOLUTION:
                    reasons.append(f"{_describe(process)} ended at {process.ended_at}")
            if reasons:
                problems.append(
                    f"trial {trial_id}: attempt {earlier.attempt} overlaps attempt "
                    f"{later.attempt} (started {next_start}): {'; '.join(reasons)}"
                )
    return problems


def _fenced_out(run: TrialRun, process: TrialProcess) -> bool:
    """Whether ``process`` is the ``torchrun`` of a run whose ranks were fenced at start.

    A driver stopped between recording a run and starting it may start its
    ``torchrun`` after the run was judged gone and its slots given away: every rank
    then exits before touching a device (``storage.start_ranks``), so nothing of it
    used a slot or trained, however long the ``torchrun`` lingered. Such a run was
    launched on a claim (``claim_token``; runs older than the rank fence have none)
    and no rank of it ever started.
    """
    return (
        process.role == ProcessRole.TORCHRUN
        and run.claim_token is not None
        and run.ranks_started_at is None
        and run.ended_at is not None
    )


def _slot_overlaps(session: Session, chosen_trials: set[int]) -> list[str]:
    """Ranks on one (agent, slot) holding more than the slot at once: two whole-slot
    trials, a share and a whole trial, or shares adding up to more than one slot."""
    ranks = session.execute(
        select(TrialProcess, TrialRun.started_at)
        .join(TrialRun, TrialRun.id == TrialProcess.run_id)
        .where(TrialProcess.role == ProcessRole.RANK)
    ).all()
    handed_on = _handed_on(process for process, _ in ranks)
    eighths = _trial_eighths(session)
    now = utcnow()
    by_slot: dict[tuple[str, int], list[tuple[dt.datetime, TrialProcess]]] = defaultdict(list)
    for process, run_started in ranks:
        since = _serving_since(process, run_started, handed_on)
        for slot in process.slots:
            by_slot[process.agent, int(slot)].append((since, process))
    problems = []
    for (agent, slot), users in by_slot.items():
        users.sort(key=lambda user: (user[0], user[1].id))
        for i, (since, second) in enumerate(users):
            # Who holds the slot as ``second`` starts: one entry per other trial (a warm
            # job's rows of one process, handed from trial to trial, serve one at a time).
            holding = {
                first.trial_id: first
                for _, first in users[:i]
                if since + _START_RESOLUTION < (first.ended_at or now)
                and first.trial_id != second.trial_id
                and not _same_process(first, second)
            }
            if not holding or not ({second.trial_id, *holding} & chosen_trials):
                continue
            held = eighths.get(second.trial_id, EIGHTHS_PER_SLOT) + sum(
                eighths.get(trial_id, EIGHTHS_PER_SLOT) for trial_id in holding
            )
            if held <= EIGHTHS_PER_SLOT:
                continue  # shares of the slot, within its capacity
            who = " and ".join(_describe(p) for p in [*holding.values(), second])
            shares = (
                ""
                if held == 2 * EIGHTHS_PER_SLOT and len(holding) == 1
                else (f" ({held} eighths of its 8)")
            )
            problems.append(
                f"slot {slot} of agent '{agent}': {who} held it at the same time "
                f"(from {since}){shares}"
            )
    return problems


def _trial_eighths(session: Session) -> dict[int, int]:
    """The eighths of its slot each trial of a share search holds (absent: whole slots).

    A search's share is its config's ``resources.slots_per_trial``; an unreadable config
    counts as whole slots (the strictest reading).
    """
    result: dict[int, int] = {}
    for experiment_id, config in session.execute(select(Experiment.id, Experiment.config)):
        try:
            share = read_stored_resources(config).slot_share
        except StoredConfigError:
            continue
        if share < 1:
            for trial_id in session.scalars(
                select(Trial.id).where(Trial.experiment_id == experiment_id)
            ):
                result[trial_id] = slot_eighths(share)
    return result


def _same_process(first: TrialProcess, second: TrialProcess) -> bool:
    """Whether two rows name one operating-system process (a warm job's, under two runs)."""
    return _ref(first).same_as(_ref(second))


def _ref(process: TrialProcess) -> ProcessRef:
    return ProcessRef(process.host, process.pid, process.create_time)


def _handed_on(processes: Iterable[TrialProcess]) -> set[int]:
    """The rows of processes recorded under more than one run: a warm job's, handed from
    trial to trial (by row id)."""
    by_pid: dict[tuple[str, int], list[TrialProcess]] = defaultdict(list)
    for process in processes:
        by_pid[process.host, process.pid].append(process)
    handed: set[int] = set()
    for rows in by_pid.values():
        for first, second in itertools.combinations(rows, 2):
            if first.run_id != second.run_id and _same_process(first, second):
                handed.update((first.id, second.id))
    return handed


def _serving_since(
    process: TrialProcess, run_started: dt.datetime, handed_on: set[int]
) -> dt.datetime:
    """When a process began to serve the run its row is under.

    A process row's start is the kernel's start of the process. A warm job's processes
    serve one trial after another and are recorded under each run they serve: such a
    row serves its run from the run's start at the earliest.
    """
    if process.id in handed_on:
        return max(process.started_at, run_started)
    return process.started_at


def _describe(process: TrialProcess) -> str:
    what = process.role.value if process.rank is None else f"rank {process.rank}"
    return f"{what} (pid {process.pid}) of trial {process.trial_id} attempt {process.attempt}"
