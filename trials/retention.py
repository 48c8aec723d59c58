"""Which checkpoints survive garbage collection (Determined's retention rules).

A checkpoint is kept when it is among its trial's ``save_trial_latest`` newest, its
trial's ``save_trial_best`` best, or the experiment's ``save_experiment_best`` best
(by the searcher metric recorded with it); everything else of the trial is deleted.

Whatever the policy says, three kinds of checkpoint are never deleted: the trial's
newest (a restart or a resume continues from it, and it is the trial's final state),
any checkpoint that a run of the trial which has not ended is restoring from
(deleting it under a starting attempt fails that attempt), and the newest one that is
intact. Before it deletes any of a trial's checkpoints, retention checks the kept ones
against their manifests, newest first, until one is intact
(:func:`newest_intact`): the damaged ones it passes are marked CORRUPTED (kept for
inspection, as every CORRUPTED checkpoint is: retention never deletes one), and when
none of the kept ones is intact the newest intact one among those the policy would
delete is kept as well. A checkpoint the caller has just written whole counts as intact
without being read back (``known_intact``). Retention run by an
attempt that has been superseded never gets this far: the runtime's fenced
transaction refuses it first. The rules are pure functions the runtime and the
driver share; :func:`collect_garbage` applies them to the database and the storage
(a folder or a bucket, :mod:`trials.checkpoint_storage`), and also deletes what a
crash left in the trials' folders:

- half-written checkpoints (a ``.tmp-*`` folder, a prefix without a manifest), a
  trial's folder included when it has no recorded checkpoint at all: no run writes
  there when it runs (rank 0 collects after its own write has ended, the driver once
  no trial runs);
- whole checkpoints that no row records (rank 0 died between the manifest and the
  row), in the folder of a trial none of whose runs is running, and only in an
  experiment's own folder (``<id>-<key>``): in the old layout's ``<id>`` folder,
  another database's experiment of the same id may keep checkpoints this database
  has no row for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trials.checkpoint_storage import CheckpointCorruptedError, store_for, trial_checkpoint_dir
from trials.config import CheckpointStorageConfig

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class CheckpointRecord:
    """The facts about one live checkpoint that retention looks at."""

    uuid: str
    trial_id: int
    step: int
    metric: float | None = None


def _best(
    records: Iterable[CheckpointRecord], n: int, smaller_is_better: bool
) -> list[CheckpointRecord]:
    if n <= 0:
        return []
    scored = [r for r in records if r.metric is not None]
    # Ties go to the newer checkpoint: it carries more training for the same metric.
    scored.sort(key=lambda r: (r.metric if smaller_is_better else -r.metric, -r.step))  # type: ignore[operator]
    return scored[:n]


def checkpoints_to_keep(
    trial_checkpoints: Sequence[CheckpointRecord],
    experiment_checkpoints: Sequence[CheckpointRecord],
    *,
    save_trial_latest: int,
    save_trial_best: int,
    save_experiment_best: int,
    smaller_is_better: bool,
    pinned: Collection[str] = (),
) -> set[str]:
    """The uuids of ``trial_checkpoints`` that retention keeps.

    ``trial_checkpoints`` are one trial's live checkpoints in the order they were
    recorded; the newest (highest step, the later record on a tie) is always kept, as
    is every uuid in ``pinned`` (checkpoints that unfinished runs restore from).

    Example:
        >>> ckpts = [CheckpointRecord(f"c{i}", 1, i, m) for i, m in enumerate([0.5, 0.2, 0.9])]
        >>> sorted(checkpoints_to_keep(ckpts, ckpts, save_trial_latest=0, save_trial_best=1,
        ...        save_experiment_best=0, smaller_is_better=True, pinned={"c0"}))
        ['c0', 'c1', 'c2']
    """
    # A stable sort: of two checkpoints at one step, the later record counts as newer.
    newest_first = sorted(trial_checkpoints, key=lambda r: r.step)[::-1]
    keep = {r.uuid for r in newest_first[: max(save_trial_latest, 1)]}
    keep |= {r.uuid for r in _best(trial_checkpoints, save_trial_best, smaller_is_better)}
    mine = {r.uuid for r in trial_checkpoints}
    keep |= mine & set(pinned)
    keep |= {
        r.uuid
        for r in _best(experiment_checkpoints, save_experiment_best, smaller_is_better)
        if r.uuid in mine
    }
    return keep


def checkpoints_to_delete(
    trial_checkpoints: Sequence[CheckpointRecord],
    experiment_checkpoints: Sequence[CheckpointRecord],
    *,
    save_trial_latest: int,
    save_trial_best: int,
    save_experiment_best: int,
    smaller_is_better: bool,
    pinned: Collection[str] = (),
) -> list[CheckpointRecord]:
    """The checkpoints of the trial that retention removes (oldest first)."""
    keep = checkpoints_to_keep(
        trial_checkpoints,
        experiment_checkpoints,
        save_trial_latest=save_trial_latest,
        save_trial_best=save_trial_best,
        save_experiment_best=save_experiment_best,
        smaller_is_better=smaller_is_better,
        pinned=pinned,
    )
    return sorted((r for r in trial_checkpoints if r.uuid not in keep), key=lambda r: r.step)


def newest_intact(
    trial_checkpoints: Sequence[CheckpointRecord],
    problem_of: Callable[[CheckpointRecord], str | None],
) -> tuple[str | None, dict[str, str]]:
    """The trial's newest checkpoint that is intact, and the damaged ones newer than it.

    ``problem_of`` checks one checkpoint (None: intact); they are checked newest first
    (highest step, the later record on a tie), and none older than the first intact one.
    Returns its uuid (None when none is intact) and ``{uuid: problem}`` of those before it.

    Example:
        >>> ckpts = [CheckpointRecord(f"c{i}", 1, i) for i in (1, 2, 3)]
        >>> newest_intact(ckpts, lambda r: "state.pt is missing" if r.uuid == "c3" else None)
        ('c2', {'c3': 'state.pt is missing'})
    """
    damaged: dict[str, str] = {}
    for record in sorted(trial_checkpoints, key=lambda r: r.step)[::-1]:
        problem = problem_of(record)
        if problem is None:
            return record.uuid, damaged
        damaged[record.uuid] = problem
    return None, damaged


def collect_garbage(
    session: Session,
    *,
    experiment_id: int,
    policy: CheckpointStorageConfig,
    metric: str,
    smaller_is_better: bool,
    trial_id: int | None = None,
    known_intact: Collection[str] = (),
) -> list[str]:
    """Apply retention in the database and the storage; the uuids deleted.

    ``trial_id`` limits it to one trial (rank 0 after each checkpoint); ``None`` sweeps
    every trial of the experiment (the driver, once no trial runs), since a checkpoint
    kept as one of the experiment's best may have been overtaken by a later trial.
    ``known_intact`` are uuids the caller has just written whole: not read back.
    """
    from sqlalchemy import select

    from storage import Checkpoint, CheckpointState, Trial, TrialRun

    query = select(Checkpoint).where(Checkpoint.state == CheckpointState.COMPLETED)
    restoring = select(TrialRun.restored_from_checkpoint).where(
        TrialRun.ended_at.is_(None), TrialRun.restored_from_checkpoint.is_not(None)
    )
    if trial_id is None or policy.save_experiment_best > 0:
        query = query.join(Trial, Trial.id == Checkpoint.trial_id).where(
            Trial.experiment_id == experiment_id
        )
    else:
        query = query.where(Checkpoint.trial_id == trial_id)
    if trial_id is None:
        restoring = restoring.join(Trial, Trial.id == TrialRun.trial_id).where(
            Trial.experiment_id == experiment_id
        )
    else:
        restoring = restoring.where(TrialRun.trial_id == trial_id)
    # In id order: of two checkpoints at one step, the later record is the newer.
    rows = list(session.scalars(query.order_by(Checkpoint.id)))
    pinned = {uuid for uuid in session.scalars(restoring) if uuid is not None}
    records = [
        CheckpointRecord(row.uuid, row.trial_id, row.step, (row.metrics or {}).get(metric))
        for row in rows
    ]
    by_trial: dict[int, list[CheckpointRecord]] = {}
    for record in records:
        if trial_id is None or record.trial_id == trial_id:
            by_trial.setdefault(record.trial_id, []).append(record)
    by_uuid = {row.uuid: row for row in rows}

    def problem_of(record: CheckpointRecord) -> str | None:
        if record.uuid in known_intact:
            return None
        location = by_uuid[record.uuid].path
        try:
            store_for(location).verify(location)
        except CheckpointCorruptedError as damaged:
            return damaged.problem
        return None

    doomed: set[str] = set()
    for trial_records in by_trial.values():
        deleting = {
            record.uuid
            for record in checkpoints_to_delete(
                trial_records,
                records,
                save_trial_latest=policy.save_trial_latest,
                save_trial_best=policy.save_trial_best,
                save_experiment_best=policy.save_experiment_best,
                smaller_is_better=smaller_is_better,
                pinned=pinned,
            )
        }
        if not deleting:
            continue  # nothing goes: nothing needs reading
        intact, damaged = newest_intact(trial_records, problem_of)
        for uuid, problem in damaged.items():
            by_uuid[uuid].state = CheckpointState.CORRUPTED
            by_uuid[uuid].problem = problem
        doomed |= deleting - set(damaged) - {intact}
    for row in rows:
        if row.uuid in doomed:
            store_for(row.path).delete(row.path)
            row.state = CheckpointState.DELETED
    _delete_leftovers(
        session,
        experiment_id,
        policy,
        rows if trial_id is None else [r for r in rows if r.trial_id == trial_id],
        trial_id,
    )
    return sorted(doomed)


def _delete_leftovers(
    session: Session,
    experiment_id: int,
    policy: CheckpointStorageConfig,
    rows: Sequence[Any],
    trial_id: int | None,
) -> None:
    """Delete what a crash left in the trials' folders: half-written checkpoints, and
    whole ones whose row was never recorded.

    The folders are those of ``rows``' checkpoints and those the layout gives the
    experiment's trials (``trial_id``'s alone when given): a trial whose only upload
    was killed half-way has no row to find its folder by. A location any row records
    (whatever its state) is never touched.
    """
    from sqlalchemy import select

    from storage import Experiment, Trial

    folders = {row.path.rstrip("/").rsplit("/", 1)[0] for row in rows}
    experiment = session.get(Experiment, experiment_id)
    own: dict[str, int] = {}
    if experiment is not None:
        trial_ids = (
            [trial_id]
            if trial_id is not None
            else session.scalars(select(Trial.id).where(Trial.experiment_id == experiment_id))
        )
        layout = {
            str(
                trial_checkpoint_dir(
                    policy.path, experiment.model_dir, experiment.checkpoint_folder, tid
                )
            ): tid
            for tid in trial_ids
        }
        folders |= set(layout)
        # Under the old layout (``<id>/``) another database's experiment of this id may
        # write in the same folders: its whole checkpoints have no row here.
        if experiment.owns_checkpoint_folder:
            own = layout
    for folder in sorted(folders):
        _delete_half_written(session, folder)
    for folder, tid in sorted(own.items()):
        _delete_unrecorded(session, folder, tid)


def _delete_half_written(session: Session, folder: str) -> None:
    """Delete the checkpoints in ``folder`` whose write a crash cut short (no row records one).

    No run writes there while this runs: rank 0 collects after its own write has ended,
    the driver once no trial runs.
    """
    from sqlalchemy import select

    from storage import Checkpoint

    store = store_for(folder)
    leftovers = store.incomplete(folder)
    if not leftovers:
        return
    recorded = set(session.scalars(select(Checkpoint.path).where(Checkpoint.path.in_(leftovers))))
    for location in leftovers:
        if location not in recorded:
            store.delete(location)


def _delete_unrecorded(session: Session, folder: str, trial_id: int) -> None:
    """Delete the whole checkpoints in trial ``trial_id``'s own ``folder`` that no row records.

    A crash between a checkpoint's manifest and its row leaves one; nothing else will
    ever read it. Only while no run of the trial is running: a running rank 0 may be
    between the two steps of its write. Asked again after the folder is listed, so a
    run that started meanwhile is seen, and the rows read after it, so a checkpoint
    recorded meanwhile is too. A checkpoint is matched to its row by uuid (its name in
    the folder), which does not depend on how the folder's path was spelled when the
    row was written.
    """
    from sqlalchemy import select

    from storage import Checkpoint, TrialRun

    running = (
        select(TrialRun.id)
        .where(TrialRun.trial_id == trial_id, TrialRun.ended_at.is_(None))
        .limit(1)
    )
    # First without listing: rank 0's own collection always finds its run running.
    if session.scalar(running) is not None:
        return
    store = store_for(folder)
    written = {
        location.rstrip("/").rsplit("/", 1)[-1]: location for location in store.whole(folder)
    }
    if not written or session.scalar(running) is not None:
        return
    recorded = set(
        session.scalars(select(Checkpoint.uuid).where(Checkpoint.uuid.in_(list(written))))
    )
    for uuid, location in sorted(written.items()):
        if uuid not in recorded:
            store.delete(location)
