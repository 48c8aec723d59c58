"""An attempt's restore: its checkpoint, or the newest older one that is intact (collective).

The driver names the trial's newest recorded checkpoint (``restore_checkpoint_path``).
Every rank reads it, each file checked against the checkpoint's manifest before
``torch.load`` (:func:`~trials.runtime._checkpoint.read_checkpoint`). When rank 0 finds
it damaged (a file missing, truncated or altered: a full disk, a torn write, an object
half-uploaded or deleted), the checkpoint is marked CORRUPTED (its files stay for
inspection; it is never chosen again) and every rank goes on to the trial's next older
recorded checkpoint; when none is left the trial starts over from step 0, what earlier
attempts recorded rewound. The trial log gets one line per skipped checkpoint, and the
run's reason says which were skipped, why, and where the attempt continued from
(:func:`restore_note`); ``slotsweep describe`` and the UI read both.

Rank 0 decides for every rank (its answer is broadcast): what rank 0 reads is what it
wrote. Another rank that cannot read a checkpoint rank 0 read (a folder its node does
not share) fails the attempt with one line, as does a checkpoint that is intact but
that this trial's code cannot load
(:class:`~trials.runtime._checkpoint.CheckpointMismatchError`): an older checkpoint
would fail alike, and starting over would hide the mistake.

Example:
    >>> skipped = Skipped("/ckpt/7/635301b5-9c2e", 9, "state.pt: 64 bytes, its manifest says 6221")
    >>> restore_note([skipped], 6)
    'continued from the checkpoint of step 6; skipped the checkpoint of step 9 (635301b5): state.pt: 64 bytes, its manifest says 6221'
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trials.checkpoint_storage import CheckpointCorruptedError
from trials.config import RuntimeSpec
from trials.entrypoints import InvalidTrialError
from trials.labels import checkpoint_label
from trials.runtime._checkpoint import one_line, read_checkpoint
from trials.runtime._distributed import broadcast_object, gather_to_chief
from trials.runtime._recording import Recorder

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Restored:
    """The checkpoint an attempt continues from: its loaded state and its location."""

    state: dict[str, Any]
    location: str


@dataclass(frozen=True)
class Fallback:
    """What marking a damaged checkpoint leaves a restore with.

    ``skipped_step`` is the marked checkpoint's step (None when no row records it);
    ``location`` and ``step`` are the trial's next older recorded checkpoint to try
    (None: none is left, the trial starts over).
    """

    skipped_step: int | None = None
    location: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class Skipped:
    """A checkpoint the restore passed over, and why (one line naming the file)."""

    location: str
    step: int | None
    problem: str

    @property
    def name(self) -> str:
        return checkpoint_label(self.location, self.step)


def restore_note(skipped: Sequence[Skipped], restored_step: int | None) -> str:
    """The run's reason once its restore skipped ``skipped`` (newest first).

    ``restored_step`` is the step of the checkpoint it continued from; None when none was
    left and the trial started over.

    Example:
        >>> first = Skipped("/c/7/aaaaaaaa-1", 9, "state.pt is missing")
        >>> restore_note([first, Skipped("/c/7/bbbbbbbb-2", 6, "MANIFEST.json cannot be read")], None)
        'started over from step 0: every checkpoint was damaged; skipped the checkpoint of step 9 (aaaaaaaa): state.pt is missing; the checkpoint of step 6 (bbbbbbbb): MANIFEST.json cannot be read'
    """
    what = "; ".join(f"{s.name}: {s.problem}" for s in skipped)
    if restored_step is None:
        return f"started over from step 0: every checkpoint was damaged; skipped {what}"
    return f"continued from the checkpoint of step {restored_step}; skipped {what}"


@dataclass(frozen=True)
class _Decision:
    """Rank 0's answer on one checkpoint: ``ok``, ``skip`` (damaged) or ``fail``."""

    action: str
    text: str = ""


def decide(outcomes: Sequence[tuple[str, str] | None]) -> _Decision:
    """What every rank does with a checkpoint, from each rank's outcome reading it.

    An outcome is None (read) or ``(kind, text)``: ``corrupted`` with the problem, or
    ``failed`` with the error. Rank 0's own reading decides whether the checkpoint is
    damaged; another rank that fails where rank 0 read it fails the attempt.

    Example:
        >>> decide([None, None]), decide([("corrupted", "state.pt is missing"), None]).action
        (_Decision(action='ok', text=''), 'skip')
        >>> decide([None, ("corrupted", "state.pt is missing")]).text
        'checkpoint_storage.path: rank 1 cannot read the checkpoint rank 0 read (is its folder shared by every node?): state.pt is missing'
    """
    chief = outcomes[0]
    if chief is not None:
        kind, text = chief
        return _Decision("skip" if kind == "corrupted" else "fail", text)
    for rank, outcome in enumerate(outcomes):
        if outcome is not None:
            return _Decision(
                "fail",
                f"checkpoint_storage.path: rank {rank} cannot read the checkpoint rank 0 read "
                f"(is its folder shared by every node?): {outcome[1]}",
            )
    return _Decision("ok")


def restore_checkpoint(spec: RuntimeSpec, recorder: Recorder, is_chief: bool) -> Restored | None:
    """The checkpoint this attempt continues from, loaded on every rank; None to start anew.

    Collective: every rank calls it at the same point. See the module for what happens
    to a damaged checkpoint; raises the error of a checkpoint that cannot be loaded for
    another reason.
    """
    location = spec.restore_checkpoint_path
    if location is None:
        return None
    skipped: list[Skipped] = []
    step: int | None = None
    while location is not None:
        state: dict[str, Any] | None = None
        error: Exception | None = None
        outcome: tuple[str, str] | None = None
        try:
            state = read_checkpoint(location)
        except CheckpointCorruptedError as damaged:
            error, outcome = damaged, ("corrupted", damaged.problem)
        except Exception as failed:  # judged by rank 0 with the others' outcomes
            error, outcome = failed, ("failed", f"{type(failed).__name__}: {one_line(failed)}")
        gathered = gather_to_chief(outcome)
        decision: _Decision = broadcast_object(decide(gathered) if gathered else None)
        if decision.action == "ok":
            assert state is not None
            if skipped:
                _tell(spec, is_chief, recorder, restore_note(skipped, step))
            return Restored(state=state, location=location)
        if decision.action == "fail":
            if error is not None and not isinstance(error, CheckpointCorruptedError):
                raise error
            raise InvalidTrialError(decision.text) from error
        # Damaged: rank 0 marks it and names the next older one; every rank tries that.
        mark = functools.partial(
            skip_damaged_checkpoint, spec=spec, location=location, problem=decision.text
        )
        fallback = recorder.call_write(mark) or Fallback()
        skipped.append(Skipped(location, fallback.skipped_step, decision.text))
        if is_chief:
            then = (
                f"restoring {checkpoint_label(fallback.location, fallback.step)} instead"
                if fallback.location is not None
                else "no older checkpoint is left: the trial starts over from step 0"
            )
            _print(
                f"{skipped[-1].name} is damaged and was skipped (kept, marked CORRUPTED): "
                f"{decision.text}; {then}"
            )
        location, step = broadcast_object((fallback.location, fallback.step))
    _tell(spec, is_chief, recorder, restore_note(skipped, None))
    # The records of the abandoned timeline go: the trial trains every step again.
    recorder.rewind(0)
    return None


def _tell(spec: RuntimeSpec, is_chief: bool, recorder: Recorder, note: str) -> None:
    """The run's reason, and the same line in the trial's log (rank 0's output)."""
    recorder.call_write(lambda session: note_run_reason(session, spec, note))
    if is_chief:
        _print(note)


def _print(line: str) -> None:
    print(f"slotsweep: {line}", file=sys.stderr, flush=True)


def skip_damaged_checkpoint(
    session: Session, spec: RuntimeSpec, location: str, problem: str
) -> Fallback:
    """Mark the trial's checkpoint at ``location`` CORRUPTED because of ``problem``, and
    move this attempt's restore (its run's ``restored_from_*``, what retention keeps for
    a running attempt) to the trial's next older COMPLETED checkpoint; what is left.

    Rank 0's fenced transaction. The row is found by its path or its uuid (its folder's
    name). Idempotent: a transaction re-run after a lost acknowledgement finds the same.
    """
    from sqlalchemy import and_, or_, select

    from storage import Checkpoint, CheckpointState, TrialRun

    uuid = location.rstrip("/").rsplit("/", 1)[-1]
    row = session.scalars(
        select(Checkpoint)
        .where(
            Checkpoint.trial_id == spec.trial_id,
            or_(Checkpoint.path == location, Checkpoint.uuid == uuid),
        )
        .order_by(Checkpoint.id)
    ).first()
    older = select(Checkpoint).where(
        Checkpoint.trial_id == spec.trial_id, Checkpoint.state == CheckpointState.COMPLETED
    )
    if row is not None:
        if row.state == CheckpointState.COMPLETED:
            row.state = CheckpointState.CORRUPTED
            row.problem = problem
        older = older.where(
            or_(
                Checkpoint.step < row.step,
                and_(Checkpoint.step == row.step, Checkpoint.id < row.id),
            )
        )
    found = session.scalars(older.order_by(Checkpoint.step.desc(), Checkpoint.id.desc())).first()
    run = session.scalars(
        select(TrialRun).where(
            TrialRun.trial_id == spec.trial_id, TrialRun.attempt == spec.attempt
        )
    ).first()
    if run is not None:
        run.restored_from_checkpoint = found.uuid if found is not None else None
        run.restored_from_step = found.step if found is not None else None
    return Fallback(
        skipped_step=row.step if row is not None else None,
        location=found.path if found is not None else None,
        step=found.step if found is not None else None,
    )


def note_run_reason(session: Session, spec: RuntimeSpec, note: str) -> None:
    """Record ``note`` as this attempt's run's reason (rank 0's fenced transaction)."""
    from sqlalchemy import update

    from storage import TrialRun

    session.execute(
        update(TrialRun)
        .where(TrialRun.trial_id == spec.trial_id, TrialRun.attempt == spec.attempt)
        .values(reason=note)
    )
