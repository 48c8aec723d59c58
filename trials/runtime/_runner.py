"""One rank's whole life: join the job, run the user's trial, record how it ended, leave.

The entrypoint (``module:Name`` relative to the model directory) is either a
:class:`~trials.runtime.PyTorchTrial` subclass, run by the managed loop, or any other
callable, called with the context (the core-API escape hatch: the user's own loop).

How a trial ended is written by rank 0 into the trial's row, not told to Optuna (the
driver does that): ``finished_at`` only when the training ran to its end, ``pruned_at``
when the pruner stopped it. A preempted trial (the driver asked it to stop) writes a
checkpoint and neither.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import torch

from trials._config import RuntimeSpec
from trials.runtime._context import InvalidTrialError, PyTorchTrialContext
from trials.runtime._distributed import (
    DistributedInfo,
    destroy_process_group,
    init_process_group,
    select_device,
)
from trials.runtime._loop import ManagedLoop
from trials.runtime._recorder import ChiefRecorder
from trials.runtime._trial import PyTorchTrial


def load_entrypoint(spec: RuntimeSpec) -> Any:
    """The object ``spec.entrypoint`` names, imported with the model directory on the path."""
    module_name, _, attr = spec.entrypoint.partition(":")
    if not module_name or not attr:
        raise InvalidTrialError(
            f"entrypoint: must be 'module:Name', e.g. 'model:DigitsTrial', got {spec.entrypoint!r}"
        )
    if spec.model_dir not in sys.path:
        sys.path.insert(0, spec.model_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name.split(".")[0] and error.name != module_name:
            raise  # the user's module exists but imports something missing: show the traceback
        raise InvalidTrialError(
            f"entrypoint: no module {module_name!r} in the model directory {spec.model_dir}"
        ) from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise InvalidTrialError(f"entrypoint: module {module_name!r} has no {attr!r}") from None
    if isinstance(target, type) and issubclass(target, PyTorchTrial):
        return target
    if not callable(target):
        raise InvalidTrialError(
            f"entrypoint: {spec.entrypoint} must be a PyTorchTrial subclass or a callable "
            "taking the trial context"
        )
    return target


def _start_system_metrics(spec: RuntimeSpec) -> Any:
    from trials._system_metrics import SystemMetricsSampler

    sampler = SystemMetricsSampler(
        spec.db_url,
        trial_id=spec.trial_id,
        agent=os.environ.get("SLOTSWEEP_AGENT", spec.agent),
        interval_s=spec.profiling.system_metrics_interval_s,
    )
    sampler.start()
    return sampler


def run_trial(spec: RuntimeSpec, info: DistributedInfo | None = None) -> str:
    """Run this rank's part of the trial; the outcome (finished, pruned or preempted).

    Raises :class:`InvalidTrialError` for a trial that cannot run as configured.
    """
    info = info or DistributedInfo.from_env()
    device = select_device(info)
    joined = init_process_group(info, device)
    recorder = ChiefRecorder(spec) if info.is_chief else None
    system_metrics = None
    try:
        if spec.profiling.enabled and info.is_local_chief:
            system_metrics = _start_system_metrics(spec)
        target = load_entrypoint(spec)
        context = PyTorchTrialContext(spec, info, device, recorder)
        _seed_everything(context.seed + info.rank)
        if isinstance(target, type) and issubclass(target, PyTorchTrial):
            outcome: str = ManagedLoop(target, context).run()
        else:
            target(context)
            outcome = "pruned" if context.pruned else "finished"
        if recorder is not None and outcome == "finished":
            recorder.finished(context.steps_reported)
        elif recorder is not None:
            recorder.flush()
        return outcome
    finally:
        if system_metrics is not None:
            system_metrics.stop()
        if recorder is not None:
            recorder.close()
        if joined:
            destroy_process_group()


def _seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        return
    np.random.seed(seed % (2**32))
