"""The loop's waits for its device, and its phase timings, on the CPU and on a GPU.

On CUDA a rank must not wait for its GPU on every batch (a wait empties the GPU's queue
and stops the host from running ahead): only the training-metric report (every
``scheduling_unit`` batches), validations and checkpoints copy to the host. On the CPU
nothing is asynchronous, so the loop's waits are counted through a stand-in accelerator
that behaves as CUDA does to the loop (every ``sync_every``-th batch timed with marks
the "device" passes only when the host waits for it) and counts what the loop asks of
it. On a GPU, CUDA's own sync debug mode names every synchronising call, and the phase
times are compared with the step time measured around them.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from storage import Timing, session_scope
from trials.runtime import CpuAccelerator, accelerator_for
from trials.runtime._distributed import DistributedInfo
from trials.runtime._runner import run_trial
from trials.runtime._timing import HOST_CLOCK, PHASES

from .conftest import TrialHandle

SINGLE = DistributedInfo()


class DeviceTimeline:
    """A phase clock whose marks the "device" passes only when the host waits for it,
    the worst case for the host: a GPU that never catches up on its own.

    Marks are ``(sequence number, host time)``.
    """

    def __init__(self) -> None:
        self.made = 0
        self.passed = -1
        self.waits = 0
        self.released = 0

    def mark(self) -> tuple[int, float]:
        self.made += 1
        return (self.made - 1, time.perf_counter())

    def ready(self, mark: tuple[int, float]) -> bool:
        return mark[0] <= self.passed

    def wait(self, mark: tuple[int, float]) -> None:
        self.waits += 1
        self.passed = max(self.passed, mark[0])

    def read(self, marks: Sequence[tuple[int, float]]) -> list[float]:
        assert self.ready(marks[-1]), "a mark was read before the device passed it"
        self.released += len(marks)
        return [end[1] - start[1] for start, end in itertools.pairwise(marks)]

    def drain(self) -> None:
        """The host waited for everything queued: the device passed every mark."""
        self.passed = self.made - 1


class RecordingAccelerator:
    """The CPU posing as CUDA to the loop, counting its copies and waits.

    Like :class:`~trials.runtime._accelerator.CudaAccelerator` it times every
    ``sync_every``-th batch, and a copy to the host waits for everything queued.
    """

    def __init__(self) -> None:
        self.cpu = CpuAccelerator()
        self.timeline = DeviceTimeline()
        self.copies_to_host = 0
        self.moves = 0

    @property
    def device(self) -> torch.device:
        return self.cpu.device

    def to_device(self, data: Any) -> Any:
        self.moves += 1
        return data

    def to_host(self, tensor: torch.Tensor) -> list[float]:
        self.copies_to_host += 1
        self.timeline.drain()
        return self.cpu.to_host(tensor)

    def phase_clock(self) -> DeviceTimeline:
        return self.timeline

    def timed_every(self, sync_every: int) -> int:
        return sync_every


def timing_rows(db_url: str, trial_id: int) -> list[Timing]:
    with session_scope(db_url) as session:
        rows = session.scalars(select(Timing).where(Timing.trial_id == trial_id)).all()
        session.expunge_all()
        return list(rows)


def test_a_default_trial_waits_for_its_device_only_at_reports_and_validations(
    make_trial: Callable[..., TrialHandle],
) -> None:
    # 250 batches of 100 an epoch, every default that matters: a report every 100
    # batches (scheduling_unit), validation and checkpoint every epoch, profiling on
    # (windows of 50 batches, every 10th timed on a GPU), pruning asked.
    handle = make_trial(
        entrypoint="timed_trials:ReportingTrial",
        hparams={"global_batch_size": 8, "train_size": 800},
        slots_per_trial=1,
        max_length={"batches": 250},
        min_validation_period={"epochs": 1},
        min_checkpoint_period={"epochs": 1},
    )
    assert handle.spec.profiling.model_dump() == {
        "enabled": True,
        "window_batches": 50,
        "sync_every": 10,
        "system_metrics_interval_s": 5.0,
        "synthetic_data": False,
    }
    device = RecordingAccelerator()
    assert run_trial(handle.spec, SINGLE, make_accelerator=lambda _: device) == "finished"

    reports = 3  # steps 100, 200 and the last, 250
    validations = 3  # the same steps
    validation_batches = 6  # 16 samples in batches of 3, each validation
    assert device.copies_to_host == reports + validations
    assert device.timeline.waits == 0  # the last validation's copy passed every mark
    assert device.moves == 250 + validations * validation_batches
    # Batches 1, 11, ..., 241: a start mark, then dataloader_next, to_device,
    # train_batch, step_lr_schedulers; each event was handed back for reuse.
    assert device.timeline.made == 25 * 5
    assert device.timeline.released == device.timeline.made

    rows = timing_rows(handle.db_url, handle.spec.trial_id)
    windows = {(r.start_step, r.end_step) for r in rows}
    assert windows == {(0, 50), (50, 100), (100, 150), (150, 200), (200, 250)}
    assert {r.name for r in rows} == set(PHASES[:4])
    assert all(r.count == 5 and r.total_s >= 0 for r in rows)


def test_on_the_cpu_every_batch_is_timed_by_the_host_clock() -> None:
    cpu = accelerator_for(torch.device("cpu"))
    assert cpu.phase_clock() is HOST_CLOCK
    assert cpu.timed_every(10) == 1
    batch = (torch.zeros(2), [torch.ones(1)])
    assert cpu.to_device(batch) is batch


# -- on a GPU ----------------------------------------------------------------------------


def wide_trial(
    make_trial: Callable[..., TrialHandle], batches: int, **hparams: Any
) -> TrialHandle:
    """``WideTrial`` on one GPU: batches of 1024 in one long epoch, validated at the end."""
    return make_trial(
        entrypoint="timed_trials:WideTrial",
        hparams={"global_batch_size": 1024, **hparams},
        slots_per_trial=1,
        max_length={"batches": batches},
        min_validation_period={"batches": batches},
        pruning=False,
    )


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_phases_add_up_to_the_step_time(make_trial: Callable[..., TrialHandle]) -> None:
    """The phases of the timed batches (CUDA events, every 10th batch) add up to within
    10% of the wall time per step measured between two synchronisations."""
    handle = wide_trial(make_trial, 600, clock_batches=[150, 550])
    assert run_trial(handle.spec, SINGLE) == "finished"
    clock = json.loads((Path(handle.spec.scratch_dir) / "rank-0" / "step_clock.json").read_text())

    per_window: dict[tuple[int, int], list[Timing]] = {}
    for row in timing_rows(handle.db_url, handle.spec.trial_id):
        per_window.setdefault((row.start_step, row.end_step), []).append(row)
    inside = [rows for (start, end), rows in per_window.items() if start >= 150 and end <= 550]
    assert len(inside) == 8, sorted(per_window)
    timed_batches = sum(r.count for rows in inside for r in rows if r.name == "train_batch")
    phases_s = math.fsum(r.total_s for rows in inside for r in rows) / timed_batches
    assert timed_batches == 40
    assert phases_s == pytest.approx(clock["step_s"], rel=0.10), (phases_s, clock)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_trial_synchronises_only_at_reports(make_trial: Callable[..., TrialHandle]) -> None:
    """Under CUDA's sync debug mode every synchronising call warns: between two batches
    there is none, except the training-metric report's one copy every 100 batches."""
    handle = wide_trial(make_trial, 300, mark_batches=True)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            assert run_trial(handle.spec, SINGLE) == "finished"
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    syncs_after: dict[int, int] = {}
    step = 0
    for warning in caught:
        if type(warning.message).__name__ == "BatchMark":
            step = int(str(warning.message)) + 1
            syncs_after[step] = 0
        elif "synchroniz" in str(warning.message):
            syncs_after[step] = syncs_after.get(step, 0) + 1
    assert sorted(syncs_after)[-1] == 300
    # Set-up (step 0) copies the model to the GPU; the last step reports, validates and
    # checkpoints: waits are expected there.
    during = {s: n for s, n in syncs_after.items() if n and 0 < s < 300}
    assert during == {100: 1, 200: 1}, during
