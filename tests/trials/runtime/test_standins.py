"""The runtime's optional parts and their do-nothing stand-ins, in one process.

Which rank records, writes checkpoints and asks to stop is decided where the context
is built; these check each stand-in does nothing, and that a context holds the real
part on rank 0 and the stand-in elsewhere. No process group, no database: a rank 1 of
four here runs its collectives as no-ops.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from trials.runtime import CpuAccelerator, InvalidTrialError, PyTorchTrialContext
from trials.runtime._checkpoint import NO_CHECKPOINTS, read_checkpoint
from trials.runtime._context import LRStepMode
from trials.runtime._distributed import DistributedInfo
from trials.runtime._outcome import TrialOutcome
from trials.runtime._preemption import NO_PREEMPTION, ChiefPreemption
from trials.runtime._recorder import RankProcess
from trials.runtime._recording import NO_RECORDER, NoRecorder
from trials.runtime._timing import TimingWindow
from trials.runtime._warm import _Message

from .test_context import spec


class CallLog(NoRecorder):
    """A recorder that notes every call, as the real one would receive it."""

    def __init__(self, *, stop_requested: bool = False) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._stop = stop_requested
        self.prune = False

    @property
    def stop_requested(self) -> bool:
        return self._stop

    def training_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        self.calls.append(("training_metrics", (step, epoch, dict(values))))

    def validation_metrics(
        self, step: int, epoch: float | None, values: Mapping[str, float]
    ) -> None:
        self.calls.append(("validation_metrics", (step, epoch, dict(values))))

    def report_intermediate(self, value: float, step: int, moment: float) -> None:
        self.calls.append(("report_intermediate", (value, step)))

    def should_prune(self) -> bool:
        return self.prune

    def pruned(self, total_batches: int) -> None:
        self.calls.append(("pruned", (total_batches,)))

    def rewind(self, step: int) -> None:
        self.calls.append(("rewind", (step,)))

    def checkpoint(self, **fields: Any) -> list[str]:
        self.calls.append(("checkpoint", (fields,)))
        return []

    def stop_asked_by_cluster(self) -> None:
        self.calls.append(("stop_asked_by_cluster", ()))
        self._stop = True


def make_context(
    tmp_path: Path, recorder: NoRecorder = NO_RECORDER, *, rank: int = 0, **changes: Any
) -> PyTorchTrialContext:
    info = DistributedInfo(rank=rank, local_rank=rank, world_size=4, local_world_size=4)
    fields: dict[str, Any] = {"hparams": {"global_batch_size": 128}, **changes}
    return PyTorchTrialContext(spec(tmp_path, **fields), info, CpuAccelerator(), recorder)


def test_the_recorder_stand_in_records_nothing_and_never_prunes_or_stops() -> None:
    window = TimingWindow("train_batch", 0, 2, 2, 0.5, 0.5, 0.6, 1.0)
    process = RankProcess(1, 1, "h", "a", 7, 1.0, (1,))
    recorder: Any = NO_RECORDER
    for call in (
        lambda: recorder.register([process]),
        lambda: recorder.training_metrics(1, None, {"loss": 1.0}),
        lambda: recorder.validation_metrics(1, 0.5, {"val_loss": 1.0}),
        lambda: recorder.report_intermediate(1.0, 1, 0.0),
        lambda: recorder.pruned(1),
        lambda: recorder.finished(1),
        lambda: recorder.rewind(0),
        lambda: recorder.timings([window]),
        lambda: recorder.stop_asked_by_cluster(),
        lambda: recorder.flush(),
        lambda: recorder.close(),
    ):
        assert call() is None
    path = Path("ckpt")
    assert (
        recorder.checkpoint(uuid="u", step=1, epoch=None, path=path, size_bytes=1, metrics={})
        == []
    )
    assert (recorder.should_prune(), recorder.stop_requested) == (False, False)


def test_the_checkpoint_stand_in_never_builds_the_state() -> None:
    def build() -> dict[str, Any]:
        raise AssertionError("a rank that writes no checkpoint built its state")

    assert NO_CHECKPOINTS.write(build, steps_completed=3, epoch=None, metrics={}) is None


def test_the_preemption_stand_in_never_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trials.runtime._preemption.stop_asked", lambda: True)
    assert NO_PREEMPTION.requested() is False


@pytest.mark.parametrize(
    ("sigterm", "driver", "asked", "recorded"),
    [
        (False, False, False, []),
        (False, True, True, []),
        (True, False, True, [("stop_asked_by_cluster", ())]),
    ],
    ids=["nobody", "the_driver", "the_cluster"],
)
def test_rank_0_stops_when_the_driver_or_the_cluster_asks(
    monkeypatch: pytest.MonkeyPatch,
    sigterm: bool,
    driver: bool,
    asked: bool,
    recorded: Sequence[tuple[str, tuple[Any, ...]]],
) -> None:
    monkeypatch.setattr("trials.runtime._preemption.stop_asked", lambda: sigterm)
    recorder = CallLog(stop_requested=driver)
    assert ChiefPreemption(recorder).requested() is asked
    assert recorder.calls == recorded


def test_rank_0_holds_the_real_parts_and_the_others_the_stand_ins(tmp_path: Path) -> None:
    chief = make_context(tmp_path, CallLog(), rank=0)
    other = make_context(tmp_path, CallLog(), rank=1)
    assert other._checkpoints is NO_CHECKPOINTS and other._preemption is NO_PREEMPTION
    assert chief._checkpoints is not NO_CHECKPOINTS
    assert chief._preemption is not NO_PREEMPTION


def test_rank_0_writes_and_records_a_checkpoint_with_the_same_steps_metrics(
    tmp_path: Path,
) -> None:
    recorder = CallLog()
    ctx = make_context(tmp_path, recorder)
    ctx.report_validation_metrics(6, {"val_loss": 0.25})
    uuid = ctx.save_checkpoint({"w": torch.ones(2)}, 6, epoch=2.0)
    state = read_checkpoint(ctx.checkpoint_dir / uuid)
    assert (state["kind"], state["steps_completed"]) == ("core", 6)
    assert torch.equal(state["user_state"]["w"], torch.ones(2))
    (fields,) = [args[0] for name, args in recorder.calls if name == "checkpoint"]
    assert (fields["uuid"], fields["step"], fields["epoch"]) == (uuid, 6, 2.0)
    assert fields["metrics"] == {"val_loss": 0.25}
    assert fields["path"] == ctx.checkpoint_dir / uuid


def test_another_rank_writes_no_checkpoint(tmp_path: Path) -> None:
    recorder = CallLog()
    ctx = make_context(tmp_path, recorder, rank=1)
    # No process group here, so the uuid "broadcast" is this rank's own: none.
    assert ctx.save_checkpoint({"w": torch.ones(2)}, 6) == "None"
    assert not ctx.checkpoint_dir.exists()
    assert recorder.calls == []


def test_the_chief_reports_validations_to_the_pruner_at_the_epoch(tmp_path: Path) -> None:
    recorder = CallLog()
    ctx = make_context(tmp_path, recorder)  # pruning is on by default
    ctx.report_validation_metrics(40, {"val_loss": 0.5}, epoch=2.0)
    assert recorder.calls == [
        ("validation_metrics", (40, 2.0, {"val_loss": 0.5})),
        ("report_intermediate", (0.5, 2)),
    ]
    recorder.prune = True
    assert ctx.should_prune() and ctx.pruned
    assert recorder.calls[-1] == ("pruned", (40,))


def test_a_context_without_a_recorder_never_prunes(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    ctx.report_validation_metrics(40, {"val_loss": 0.5}, epoch=2.0)
    assert not ctx.should_prune() and not ctx.pruned


def test_lr_scheduler_step_modes_are_kept_as_an_enum(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    ctx.wrap_lr_scheduler(scheduler, "epoch")
    ((_, mode),) = ctx.lr_schedulers
    assert mode is LRStepMode.EPOCH and mode == "epoch"
    with pytest.raises(
        InvalidTrialError,
        match="wrap_lr_scheduler: step_mode must be optimizer_step, epoch or manual, got 'steps'",
    ):
        ctx.wrap_lr_scheduler(scheduler, "steps")  # type: ignore[arg-type]


def test_outcomes_print_and_compare_as_the_worker_shows_them() -> None:
    assert [f"{outcome}" for outcome in TrialOutcome] == ["finished", "pruned", "preempted"]
    assert TrialOutcome.PRUNED == "pruned"


def test_warm_messages_survive_the_broadcasts_pickling_as_themselves() -> None:
    for message in _Message:
        assert pickle.loads(pickle.dumps((message, None)))[0] is message
