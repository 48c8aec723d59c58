"""One rank's whole life: join the job, run the user's trial, record how it ended, leave.

The entrypoint (``module:Name`` relative to the model directory) is either a
:class:`~trials.runtime.PyTorchTrial` subclass, run by the managed loop, or any other
callable, called with the context (the core-API escape hatch: the user's own loop).

How a trial ended is written by rank 0 into the trial's row, not told to Optuna (the
driver does that): ``finished_at`` only when the training ran to its end, ``pruned_at``
when the pruner stopped it. A preempted trial (the driver asked it to stop) writes a
checkpoint and neither.

Right after the process group forms, every rank's process (pid, kernel start time,
host, agent, slot) is gathered to rank 0, which records them under this attempt's run:
that is how a later driver finds and ends a rank that outlived its ``torchrun``.

A rank stops with one line and a non-zero exit (no traceback) when its attempt was
superseded (exit 3), when the database stayed unreachable (1), or when a checkpoint
could not be written to ``checkpoint_storage.path`` (1).

A rank that fails with an exception (a trial that cannot run as configured, the user's
code raising, a checkpoint refused) records why under its run before it exits
(:mod:`trials.runtime._failure`), once it has left the process group.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from trials.checkpoint_storage import CheckpointStorageError
from trials.config import RuntimeSpec
from trials.entrypoints import load_entrypoint
from trials.launch.launcher import AGENT_ENV_VAR, SLOTS_ENV_VAR
from trials.launch.processes import ProcessRef
from trials.runtime._accelerator import Accelerator, accelerator_for
from trials.runtime._context import PyTorchTrialContext, TrialContext
from trials.runtime._distributed import (
    DistributedInfo,
    destroy_process_group,
    gather_to_chief,
    init_process_group,
    select_device,
)
from trials.runtime._failure import record_failure
from trials.runtime._loop import ManagedLoop
from trials.runtime._memory_cap import explain_memory_error
from trials.runtime._outcome import TrialOutcome
from trials.runtime._recorder import ChiefRecorder, RankProcess
from trials.runtime._recorder_queue import FAILURE_EXIT_CODE, TrialStopped
from trials.runtime._recording import NO_RECORDER, Recorder
from trials.runtime._signals import sigterm_ends_at_once
from trials.runtime._trial import PyTorchTrial

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def preload_entrypoint(spec: RuntimeSpec) -> None:
    """Import ``spec.entrypoint``'s module now, ahead of the trial that runs it.

    A warm job's ranks call it between two trials, after the reset dropped the user's
    modules: the next trial's :func:`load_entrypoint` then finds the module imported
    afresh. A module that cannot be imported is left for that trial to report, with
    the trial's own error.
    """
    # SystemExit too: a module that exits at import fails its trial, not the warm job.
    with contextlib.suppress(Exception, SystemExit):
        load_entrypoint(spec.entrypoint, spec.model_dir)


class _Sampler(Protocol):
    """What the runner holds of a system-metrics sampler: something to stop at the end."""

    def stop(self) -> None: ...

    def finish(self) -> Callable[[Session], None] | None: ...


class _NoSampler:
    """The system-metrics sampler of a rank that samples none."""

    def stop(self) -> None:
        """Nothing was started."""

    def finish(self) -> None:
        """Nothing to write."""


def _start_system_metrics(spec: RuntimeSpec, info: DistributedInfo) -> _Sampler:
    """The node's sampler of host and GPU metrics: its first rank's, with profiling on."""
    if not (spec.profiling.enabled and info.is_local_chief):
        return _NoSampler()
    from trials._system_metrics import SystemMetricsSampler

    sampler = SystemMetricsSampler(
        spec.db_url,
        trial_id=spec.trial_id,
        agent=os.environ.get(AGENT_ENV_VAR, spec.agent),
        attempt=spec.attempt,
        interval_s=spec.profiling.system_metrics_interval_s,
    )
    sampler.start()
    return sampler


def this_rank_process(spec: RuntimeSpec, info: DistributedInfo) -> RankProcess:
    """This rank's process as the database records it.

    Example:
        >>> this_rank_process(spec, DistributedInfo.from_env()).pid == os.getpid()
        True
    """
    me = ProcessRef.of(os.getpid())
    slots: tuple[int, ...] = ()
    listed = os.environ.get(SLOTS_ENV_VAR, "").split(",")
    if info.local_rank < len(listed) and listed[info.local_rank].strip().isdigit():
        slots = (int(listed[info.local_rank]),)
    return RankProcess(
        rank=info.rank,
        local_rank=info.local_rank,
        host=me.host,
        agent=os.environ.get(AGENT_ENV_VAR, spec.agent),
        pid=me.pid,
        create_time=me.create_time,
        slots=slots,
    )


def join_job(spec: RuntimeSpec, info: DistributedInfo) -> bool:
    """Join the job's process group for good (a warm job's); whether a group was created.

    A rank that cannot join (rank 0's ``MASTER_PORT`` taken meanwhile, say) records why
    under ``spec``'s run, as :func:`run_trial` does, before the error goes on.
    """
    try:
        with sigterm_ends_at_once():
            return init_process_group(info, select_device(info))
    except Exception as error:
        _finish_before_terminating()
        record_failure(spec, info.rank, error, 0)
        raise


def run_trial(
    spec: RuntimeSpec,
    info: DistributedInfo | None = None,
    *,
    hand_back: Callable[[Session], object] | None = None,
    make_accelerator: Callable[[torch.device], Accelerator] = accelerator_for,
) -> TrialOutcome:
    """Run this rank's part of the trial; the outcome (finished, pruned or preempted).

    ``hand_back`` (a warm job's rank 0: :meth:`~trials.runtime.WarmChannel.hand_back_write`)
    is written in the trial's last transaction, with its end, when the trial finished
    or was pruned: one commit from the last record to the next trial's start.
    ``make_accelerator`` gives the rank's device its :class:`Accelerator` (a test passes
    a stand-in that counts the waits for the device).

    Raises :class:`InvalidTrialError` for a trial that cannot run as configured, and
    ``SystemExit`` (after one line on stderr) for a rank that must stop: see the module.
    """
    info = info or DistributedInfo.from_env()
    joined = False
    recorder: Recorder = NO_RECORDER
    system_metrics: _Sampler = _NoSampler()
    context: PyTorchTrialContext | None = None
    loop: ManagedLoop | None = None
    restored_step = 0
    # The error this rank fails with, recorded once the rank has left the group.
    failure: BaseException | None = None
    try:
        device = select_device(info)
        with sigterm_ends_at_once():
            joined = init_process_group(info, device)
        # Which rank records is chosen here, once: rank 0 writes to the database.
        recorder = ChiefRecorder(spec) if info.is_chief else NO_RECORDER
        # One collective, cheap next to the group's own start-up; only rank 0 gets a list.
        recorder.register(gather_to_chief(this_rank_process(spec, info)) or [])
        system_metrics = _start_system_metrics(spec, info)
        target = load_entrypoint(spec.entrypoint, spec.model_dir)
        context = PyTorchTrialContext(spec, info, make_accelerator(device), recorder)
        _seed_everything(context.seed + info.rank)
        if isinstance(target, type) and issubclass(target, PyTorchTrial):
            loop = ManagedLoop(target, context)
            restored_step = loop.step
            outcome = loop.run()
        else:
            # The user's loop: its own set-up counts as training (nothing tells them apart).
            recorder.training_started()
            target(context)
            outcome = TrialOutcome.PRUNED if context.pruned else TrialOutcome.FINISHED
        # The last checkpoint is recorded before the trial's end is: the driver (or the
        # warm job's next trial) must find it. A write that failed fails the trial here.
        context._wait_for_checkpoints()
        _record_the_end(recorder, system_metrics, info, context, outcome, hand_back)
        return outcome
    except TrialStopped as stop:
        # Superseded or the database is gone: there is nobody to tell.
        print(f"slotsweep: {stop}", file=sys.stderr, flush=True)
        raise SystemExit(stop.exit_code) from None
    except CheckpointStorageError as error:
        failure = error
        _finish_before_terminating()
        print(f"slotsweep: {error}", file=sys.stderr, flush=True)
        raise SystemExit(FAILURE_EXIT_CODE) from None
    except Exception as error:
        # InvalidTrialError included. Not SystemExit: a signal ended this rank. Over a
        # share's memory cap, the error says so in one line.
        failure = explain_memory_error(error)
        _finish_before_terminating()
        if failure is not error:
            raise failure from error
        raise
    finally:
        if context is not None and failure is not None:
            # A checkpoint still being written when the rank fails is recorded if its
            # write succeeds, as it would have been had training not gone on meanwhile.
            with contextlib.suppress(Exception):
                context._wait_for_checkpoints()
        system_metrics.stop()
        recorder.close()
        if joined:
            destroy_process_group()
        if failure is not None:
            record_failure(
                spec, info.rank, failure, _steps_completed(loop, context, restored_step)
            )


def _record_the_end(
    recorder: Recorder,
    system_metrics: _Sampler,
    info: DistributedInfo,
    context: TrialContext,
    outcome: TrialOutcome,
    hand_back: Callable[[Session], object] | None,
) -> None:
    """Commit the trial's end, with its last records, before the runner returns.

    On rank 0 one transaction: what is still queued, the end, the node's last
    system-metrics sample and a warm job's hand-back. Another node's sampler writes its
    own last sample when stopped.
    """
    writes: list[Callable[[Session], object]] = []
    if info.is_chief:
        last_sample = system_metrics.finish()
        if last_sample is not None:
            writes.append(last_sample)
    if outcome is TrialOutcome.FINISHED:
        recorder.finished(context.steps_reported)
    if hand_back is not None and outcome in (TrialOutcome.FINISHED, TrialOutcome.PRUNED):
        writes.append(hand_back)
    if writes:
        recorder.call_write(lambda session: [write(session) for write in writes])
    else:
        recorder.flush()


def _finish_before_terminating() -> None:
    """Let this failing rank record why before torchrun's SIGTERM ends it.

    The first rank to exit makes torchrun terminate the others, which usually fail the
    same way a moment later: without this, only the fastest rank's failure would be
    known. The rank exits on its own right after (every step of its way out is
    bounded), and torchrun's SIGKILL still ends it if not.
    """
    import signal

    with contextlib.suppress(ValueError):  # not the main thread (a test calling run_trial)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _steps_completed(
    loop: ManagedLoop | None, context: PyTorchTrialContext | None, restored_step: int
) -> int:
    """Batches this run trained before it failed (not counting a restored checkpoint's).

    A trial on the core API reports its own steps; those include a restored checkpoint's.
    """
    if loop is not None:
        return loop.step - restored_step
    return context.steps_reported if context is not None else 0


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    _seed_torch(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        return
    np.random.seed(seed % (2**32))


def _seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, without its cost where only the CPU can run.

    ``torch.manual_seed`` also seeds every accelerator backend, and one not started yet
    (CUDA, XPU, MTIA) is seeded lazily: the seed is queued with a formatted traceback of
    the caller, about 1.5 ms on every trial of a warm job here. Where no accelerator is
    available (``torch.accelerator``, torch >= 2.6) none can start, and the CPU's
    generator is all there is to seed.
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and not accelerator.is_available():
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
