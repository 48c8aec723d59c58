"""What user code holds inside a rank: the trial's context.

:class:`TrialContext` is the core API (Determined's ``core.Context`` in spirit): who
this rank is, the hyperparameters and batch sizes, a scratch directory, and the calls
that report metrics, ask whether to stop, and save or load checkpoints. A user who
writes their own training loop gets exactly this.

:class:`PyTorchTrialContext` adds what the managed loop needs from a
:class:`~trials.runtime.PyTorchTrial`: ``wrap_model`` (device placement and DDP with
the configured buckets and gradient compression), ``wrap_optimizer``,
``wrap_lr_scheduler``, and ``backward`` / ``step_optimizer``, through which gradient
aggregation and mixed precision work without the user's code knowing about them.
"""

from __future__ import annotations

import contextlib
import enum
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from trials.checkpoint_storage import trial_checkpoint_dir
from trials.config import Length, RuntimeSpec, per_slot_batch_size
from trials.entrypoints import InvalidTrialError
from trials.runtime._accelerator import Accelerator
from trials.runtime._checkpoint import (
    FORMAT_VERSION,
    NO_CHECKPOINTS,
    CheckpointMismatchError,
    CheckpointWriter,
    TrialCheckpoints,
)
from trials.runtime._data import batches_per_epoch
from trials.runtime._distributed import (
    DistributedInfo,
    broadcast_flag,
    broadcast_object,
)
from trials.runtime._metrics import MetricAccumulator, reduce_means, unpack_means
from trials.runtime._precision import PrecisionPlan, resolve_mixed_precision
from trials.runtime._preemption import NO_PREEMPTION, ChiefPreemption, Preemption
from trials.runtime._prune_gate import PruneGate
from trials.runtime._recording import NO_RECORDER, Recorder
from trials.runtime._restore import Restored, restore_checkpoint

# What user code passes to ``wrap_lr_scheduler``; the runtime keeps an LRStepMode.
StepMode = Literal["optimizer_step", "epoch", "manual"]


class LRStepMode(str, enum.Enum):
    """When the managed loop steps a wrapped LR scheduler."""

    OPTIMIZER_STEP = "optimizer_step"  # after every optimizer step
    EPOCH = "epoch"  # at every epoch's end
    MANUAL = "manual"  # never: the user's code calls step()


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint saved through :meth:`TrialContext.save_checkpoint`, loaded back."""

    state: dict[str, Any]
    steps_completed: int
    path: str


# One per process. A warm job's ranks run trial after trial in one process, so what a
# trial leaves here is there for the next; a cold trial's process starts it empty.
_WORKER_CACHE: dict[str, Any] = {}


def _trial_seed(spec: RuntimeSpec) -> int:
    # The driver's seed when it gives one (trials that share it see the same data order
    # and initialisation, which makes their comparison less noisy); otherwise one per
    # trial. Either way a restarted attempt draws the same numbers as the first.
    if spec.seed is not None:
        return spec.seed % (2**31 - 1)
    return (1_000_003 * (spec.optuna_trial_number + 1)) % (2**31 - 1)


class TrialContext:
    """The core API of a trial: ranks, hyperparameters, batch sizes, reporting, checkpoints.

    Every reporting call here is collective: call it on every rank, with the same
    metric names. Values are averaged across ranks and rank 0 records them.

    Example:
        >>> def main(context: TrialContext) -> None:  # entrypoint "model:main"
        ...     for step in range(1, 101):
        ...         loss = ...  # one step of your own loop
        ...         context.report_training_metrics(step, {"loss": loss})
        ...     context.report_validation_metrics(100, {"val_loss": 0.3})
        ...     if context.should_prune():
        ...         return
    """

    def __init__(
        self,
        spec: RuntimeSpec,
        info: DistributedInfo,
        accelerator: Accelerator,
        recorder: Recorder = NO_RECORDER,
    ) -> None:
        self.spec = spec
        self.distributed = info
        self._accelerator = accelerator
        self.device = accelerator.device
        # The optional parts, chosen here once: rank 0 writes checkpoints and decides on
        # preemption, the other ranks hold stand-ins and follow rank 0's collectives.
        self._recorder = recorder
        self._checkpoints: CheckpointWriter = NO_CHECKPOINTS
        self._preemption: Preemption = NO_PREEMPTION
        if info.is_chief:
            self._checkpoints = TrialCheckpoints(
                self.checkpoint_dir,
                experiment_id=spec.experiment_id,
                trial_id=spec.trial_id,
                recorder=recorder,
                async_upload=spec.checkpoint_storage.async_upload,
            )
            self._preemption = ChiefPreemption(recorder)
        if "global_batch_size" not in spec.hparams:
            raise InvalidTrialError(
                "hyperparameters.global_batch_size: required (a positive integer, at least "
                "slots_per_trial)"
            )
        try:
            self._per_slot, dropped = per_slot_batch_size(
                spec.hparams["global_batch_size"], info.world_size
            )
        except ValueError as error:
            raise InvalidTrialError(f"hyperparameters.{error}") from None
        self._global = int(spec.hparams["global_batch_size"])
        if dropped and info.is_chief:
            warnings.warn(
                f"global_batch_size {self._global} is not a multiple of {info.world_size} slots: "
                f"each slot trains on {self._per_slot} samples per batch and {dropped} samples "
                f"of every global batch are dropped",
                stacklevel=2,
            )
        self.seed = _trial_seed(spec)
        self._latest_validation: tuple[int, dict[str, float]] | None = None
        # Rank 0 asks the pruner only where it can answer yes; the others follow its answer.
        self._prune_gate = PruneGate(spec.pruner, spec.compute_slots)
        self.pruned = False
        self.steps_reported = 0
        # What the attempt restored, read once (the first ask; see _restored_checkpoint).
        self._restore_read = False
        self._restored: Restored | None = None

    # -- who and what ----------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.distributed.rank

    @property
    def local_rank(self) -> int:
        return self.distributed.local_rank

    @property
    def world_size(self) -> int:
        return self.distributed.world_size

    @property
    def cross_rank(self) -> int:
        """This node's rank among the trial's nodes."""
        return self.distributed.cross_rank

    @property
    def is_chief(self) -> bool:
        return self.distributed.is_chief

    @property
    def trial_id(self) -> int:
        return self.spec.trial_id

    @property
    def cache(self) -> dict[str, Any]:
        """This worker's mapping that survives across the trials of a warm job.

        The one place where state may cross trials on purpose: a loaded dataset, a
        tokenizer, frozen base weights. Everything else a trial builds is rebuilt for
        the next one. With ``resources.reuse_workers`` off (or on a job's first trial)
        it starts empty, so code that fills it on a miss runs the same cold and warm.
        Store only what the next trial may see unchanged: it is this process's memory,
        not a copy.

        Example:
            >>> if "digits" not in context.cache:  # a warm job's later trials skip this
            ...     context.cache["digits"] = (torch.rand(16, 64), torch.randint(10, (16,)))
            >>> images, labels = context.cache["digits"]
        """
        return _WORKER_CACHE

    @property
    def experiment_id(self) -> int:
        return self.spec.experiment_id

    @property
    def attempt(self) -> int:
        """The driver's attempt number of this trial: 0, then 1 after the first restart..."""
        return self.spec.attempt

    @property
    def hparams(self) -> dict[str, Any]:
        """The trial's hyperparameters (a copy: changing it changes nothing)."""
        return dict(self.spec.hparams)

    def get_hparam(self, name: str) -> Any:
        """One hyperparameter; a missing name is an error that lists the present ones."""
        try:
            return self.spec.hparams[name]
        except KeyError:
            present = ", ".join(sorted(self.spec.hparams)) or "none"
            raise InvalidTrialError(
                f"hyperparameters.{name}: not in this trial's hyperparameters ({present})"
            ) from None

    @property
    def data(self) -> dict[str, Any]:
        """The experiment config's ``data`` section."""
        return dict(self.spec.data)

    @property
    def per_slot_batch_size(self) -> int:
        """``global_batch_size // world_size``: each rank's batch."""
        return self._per_slot

    @property
    def global_batch_size(self) -> int:
        return self._global

    @property
    def max_length(self) -> Length:
        return self.spec.max_length

    @property
    def scratch_dir(self) -> Path:
        """A directory only this rank of this trial writes to (created on first use)."""
        path = Path(self.spec.scratch_dir) / f"rank-{self.rank}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- reporting -------------------------------------------------------------------

    def _average(self, metrics: Mapping[str, Any], contribute: bool = True) -> dict[str, float]:
        accumulator = MetricAccumulator()
        accumulator.add(metrics)
        packed = reduce_means(
            accumulator.sums(self.device), accumulator.weight, contribute=contribute
        )
        means, _, _ = unpack_means(accumulator.names(), self._accelerator.to_host(packed))
        return means

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Record training metrics at ``steps_completed`` (collective).

        Averaged across ranks when ``optimizations.average_training_metrics`` is true,
        else rank 0's own values are recorded.
        """
        means = self._average(
            metrics, self.spec.optimizations.average_training_metrics or self.is_chief
        )
        self.steps_reported = max(self.steps_reported, steps_completed)
        self._recorder.training_metrics(steps_completed, None, means)

    def report_validation_metrics(
        self, steps_completed: int, metrics: Mapping[str, Any], *, epoch: float | None = None
    ) -> dict[str, float]:
        """Record validation metrics averaged across ranks (collective); returns the means.

        The searcher metric goes to the trial row and, with pruning on, to Optuna as an
        intermediate value at the step of ``searcher.max_length``'s unit (``epoch``
        rounded down when the unit is epochs and ``epoch`` is given), or with
        ``pruner.resource: slot_seconds`` at the compute the trial has spent.
        """
        means = self._average(metrics)
        self._record_validation(steps_completed, epoch, means)
        return means

    def _record_validation(
        self, steps_completed: int, epoch: float | None, means: Mapping[str, float]
    ) -> None:
        """Record already averaged validation metrics (the managed loop's path)."""
        means = dict(means)
        metric = self.spec.searcher_metric
        if metric not in means:
            raise InvalidTrialError(
                f"searcher.metric: {metric!r} is not among the validation metrics "
                f"({', '.join(sorted(means)) or 'none'})"
            )
        self._latest_validation = (steps_completed, means)
        self.steps_reported = max(self.steps_reported, steps_completed)
        self._recorder.validation_metrics(steps_completed, epoch, means)
        unit = self.spec.step_unit
        moment = time.time()
        if unit == "slot_seconds":
            # Counted from the trial's runs in the database, restarts included.
            self._recorder.report_compute(means[metric] if self.spec.pruning else None, moment)
            self._prune_gate.validated(moment=moment)
        elif self.spec.pruning:
            if unit == "epochs" and epoch is not None:
                optuna_step = math.floor(epoch + 1e-9)
            else:
                optuna_step = steps_completed
            self._recorder.report_intermediate(means[metric], optuna_step, moment)
            self._prune_gate.validated(moment=moment, step=optuna_step)

    def _compute_budget_spent(self) -> bool:
        """Whether a ``max_length`` in slot-seconds is spent, as of the last validation.

        Collective: rank 0 waits for its count of the compute, every rank learns the answer.
        """
        limit = self.spec.max_length.slot_seconds
        if limit is None:
            return False
        return broadcast_flag(self._recorder.compute_spent() >= limit, self._accelerator)

    def should_prune(self) -> bool:
        """Whether the study's pruner stops this trial (collective: rank 0 asks, all learn).

        Always false with pruning off. When true, the trial is recorded as pruned;
        return from training without a checkpoint.
        """
        if not self.spec.pruning:
            return False
        ask = self.is_chief and self._prune_gate.must_ask()
        decision = broadcast_flag(ask and self._recorder.should_prune(), self._accelerator)
        if ask:
            slot_seconds = self.spec.step_unit == "slot_seconds"
            self._prune_gate.asked(spent=self._recorder.compute_spent() if slot_seconds else None)
        if decision and not self.pruned:
            self.pruned = True
            self._recorder.pruned(self.steps_reported)
        return decision

    # -- checkpoints -----------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path | str:
        """Where this trial's checkpoints are written: a folder, or a URL prefix when
        ``checkpoint_storage.path`` is one (see ``trials.runtime._checkpoint``)."""
        return trial_checkpoint_dir(
            self.spec.checkpoint_storage.path,
            self.spec.model_dir,
            self.spec.checkpoint_folder,
            self.spec.trial_id,
        )

    def _write_checkpoint(
        self,
        build_state: Callable[[], Mapping[str, Any]],
        *,
        steps_completed: int,
        epoch: float | None,
    ) -> str | None:
        """Write the state as a checkpoint where this rank writes one (rank 0); its uuid.

        The checkpoint keeps the validation metrics reported at the same step.
        """
        metrics: dict[str, float] = {}
        if self._latest_validation is not None and self._latest_validation[0] == steps_completed:
            metrics = self._latest_validation[1]
        return self._checkpoints.write(
            build_state, steps_completed=steps_completed, epoch=epoch, metrics=metrics
        )

    def _wait_for_checkpoints(self) -> None:
        """Wait until every checkpoint written so far is recorded (rank 0's background
        writes); raise the failure of one that could not be written."""
        self._checkpoints.wait()

    def save_checkpoint(
        self, state: Mapping[str, Any], steps_completed: int, *, epoch: float | None = None
    ) -> str:
        """Save rank 0's ``state`` (tensors and plain containers) as a checkpoint (collective).

        Returns the checkpoint's uuid on every rank. Only rank 0's ``state`` is written;
        the checkpoint records the validation metrics reported at the same step. With
        ``checkpoint_storage.async_upload`` the state is copied to memory here and
        written while training goes on: the checkpoint is recorded (a restart continues
        from it) once it is written, the next save and the trial's end wait for that,
        and a failed write fails the trial there.
        """
        uuid = self._write_checkpoint(
            lambda: {
                "format": FORMAT_VERSION,
                "kind": "core",
                "steps_completed": steps_completed,
                "user_state": dict(state),
            },
            steps_completed=steps_completed,
            epoch=epoch,
        )
        return str(broadcast_object(uuid))

    def load_latest_checkpoint(self) -> LoadedCheckpoint | None:
        """The checkpoint this attempt continues from (``None`` on a fresh start).

        The driver names the trial's newest when it restarts or resumes it; every rank
        loads it with ``torch.load(weights_only=True)`` once its files match their
        manifest. A damaged checkpoint is skipped for the newest older one that is
        intact (``None`` when none is: the trial starts over), as the trial's log says.
        Collective: call it on every rank.
        """
        restored = self._restored_checkpoint()
        if restored is None:
            return None
        state = restored.state
        if state.get("kind") != "core":
            raise CheckpointMismatchError(
                f"checkpoint {restored.location} was written by the managed loop, not by "
                "save_checkpoint"
            )
        steps = int(state["steps_completed"])
        self._recorder.rewind(steps)
        self.steps_reported = steps
        return LoadedCheckpoint(
            state=state["user_state"], steps_completed=steps, path=restored.location
        )

    def _restored_checkpoint(self) -> Restored | None:
        """The checkpoint the attempt continues from, read (and fallen back) on first ask."""
        if not self._restore_read:
            self._restored = restore_checkpoint(self.spec, self._recorder, self.is_chief)
            self._restore_read = True
        return self._restored


class PyTorchTrialContext(TrialContext):
    """The context of a :class:`~trials.runtime.PyTorchTrial`: the core API plus wrapping.

    Example:
        >>> from trials.runtime import PyTorchTrial
        >>> class MyTrial(PyTorchTrial):
        ...     def __init__(self, context: PyTorchTrialContext) -> None:
        ...         self.context = context
        ...         self.model = context.wrap_model(torch.nn.Linear(8, 2))
        ...         self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), 0.1))
        ...
        ...     def train_batch(self, batch, epoch_idx, batch_idx):
        ...         x, y = batch
        ...         loss = torch.nn.functional.cross_entropy(self.model(x), y)
        ...         self.context.backward(loss)
        ...         self.context.step_optimizer(self.opt)
        ...         return {"loss": loss}
    """

    def __init__(
        self,
        spec: RuntimeSpec,
        info: DistributedInfo,
        accelerator: Accelerator,
        recorder: Recorder = NO_RECORDER,
    ) -> None:
        super().__init__(spec, info, accelerator, recorder)
        self.models: list[torch.nn.Module] = []
        self.wrapped_models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[tuple[torch.optim.lr_scheduler.LRScheduler, LRStepMode]] = []
        self.precision: PrecisionPlan = resolve_mixed_precision(
            spec.optimizations.mixed_precision, self.device
        )
        if self.precision.warning and info.is_chief:
            warnings.warn(self.precision.warning, stacklevel=2)
        self.grad_scaler: torch.amp.GradScaler | None = self.precision.grad_scaler()
        # Set by the managed loop before every batch; outside it every batch steps.
        self._is_optimizer_step = True
        self._batches_accumulated = 1

    # -- wrapping ----------------------------------------------------------------------

    def wrap_model(
        self, model: torch.nn.Module, *, find_unused_parameters: bool = False
    ) -> torch.nn.Module:
        """Move ``model`` to this rank's device and, with several ranks, wrap it in DDP.

        Returns the model to call in ``train_batch`` (the DDP wrapper when distributed).
        With ``optimizations.auto_tune_tensor_fusion`` the ranks first time a few DDP
        bucket sizes on a stand-in of the model and wrap it with the fastest
        (:mod:`trials.runtime._fusion`).
        """
        model = model.to(self.device)
        self.models.append(model)
        wrapped: torch.nn.Module = model
        if self.distributed.distributed:
            from trials.runtime._ddp import wrap_ddp
            from trials.runtime._fusion import tune_tensor_fusion

            optimizations = self.spec.optimizations
            if optimizations.auto_tune_tensor_fusion:
                bucket_mb = tune_tensor_fusion(
                    model,
                    self.device,
                    optimizations,
                    self._recorder,
                    world_size=self.world_size,
                    is_chief=self.is_chief,
                )
                optimizations = optimizations.model_copy(
                    update={"tensor_fusion_threshold": bucket_mb}
                )
            wrapped = wrap_ddp(
                model,
                self.device,
                optimizations,
                find_unused_parameters=find_unused_parameters,
            )
        self.wrapped_models.append(wrapped)
        return wrapped

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Register ``optimizer`` so it is checkpointed and restored with the trial."""
        self.optimizers.append(optimizer)
        return optimizer

    def wrap_lr_scheduler(
        self,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        step_mode: StepMode = "optimizer_step",
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """Register ``scheduler``; the loop steps it after every optimizer step (default),
        at every epoch end (``"epoch"``), or never (``"manual"``: you call ``step()``).
        """
        try:
            mode = LRStepMode(step_mode)
        except ValueError:
            raise InvalidTrialError(
                f"wrap_lr_scheduler: step_mode must be optimizer_step, epoch or manual, got {step_mode!r}"
            ) from None
        self.lr_schedulers.append((scheduler, mode))
        return scheduler

    # -- the step --------------------------------------------------------------------

    @property
    def is_optimizer_step(self) -> bool:
        """Whether this batch ends a gradient-aggregation group (``step_optimizer`` steps)."""
        return self._is_optimizer_step

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with aggregation averaging and fp16 loss scaling applied."""
        k = self.spec.optimizations.aggregation_frequency
        if k > 1 and self.spec.optimizations.average_aggregated_gradients:
            loss = loss / k
        if self.grad_scaler is not None:
            loss = self.grad_scaler.scale(loss)
        loss.backward()

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[Iterable[torch.nn.Parameter]], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` and zero its gradients, on the last batch of each
        aggregation group only (a no-op on the others).

        ``clip_grads(params)`` runs on unscaled gradients just before the step, e.g.
        ``lambda ps: torch.nn.utils.clip_grad_norm_(ps, 1.0)``.
        """
        if not self._is_optimizer_step:
            return
        k = self.spec.optimizations.aggregation_frequency
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if (
            k > 1
            and self.spec.optimizations.average_aggregated_gradients
            and self._batches_accumulated != k
        ):
            # An epoch ended part-way through a group: the losses were divided by k, but
            # only this many batches contributed.
            correction = k / self._batches_accumulated
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(correction)
        if self.grad_scaler is not None:
            if clip_grads is not None:
                self.grad_scaler.unscale_(optimizer)
                clip_grads(params)
            self.grad_scaler.step(optimizer)
        else:
            if clip_grads is not None:
                clip_grads(params)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def to_device(self, data: Any) -> Any:
        """``data`` (tensors in lists, tuples and dicts) on this rank's device, copied
        without waiting for the copy (on a CPU rank: unchanged)."""
        return self._accelerator.to_device(data)

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for model in self.wrapped_models:
                no_sync = getattr(model, "no_sync", None)
                if no_sync is not None:
                    stack.enter_context(no_sync())
            yield

    # -- lengths, for building schedules in __init__ ---------------------------------

    def optimizer_steps_per_epoch(self, num_samples: int, *, drop_last: bool = False) -> int:
        """Optimizer steps per epoch over a training set of ``num_samples`` samples.

        Example:
            >>> context.global_batch_size, context.optimizer_steps_per_epoch(1000)
            (64, 16)
        """
        batches = batches_per_epoch(
            num_samples,
            world_size=self.world_size,
            batch_size=self.per_slot_batch_size,
            drop_last=drop_last,
        )
        return math.ceil(batches / self.spec.optimizations.aggregation_frequency)

    def total_optimizer_steps(self, num_samples: int, *, drop_last: bool = False) -> int:
        """Optimizer steps of the whole trial (``searcher.max_length``)."""
        batches = batches_per_epoch(
            num_samples,
            world_size=self.world_size,
            batch_size=self.per_slot_batch_size,
            drop_last=drop_last,
        )
        if self.spec.max_length.unit == "slot_seconds":
            raise InvalidTrialError(
                "searcher.max_length: in slot_seconds the trial's length in optimizer "
                "steps is not known in advance; use a schedule without a total length"
            )
        k = self.spec.optimizations.aggregation_frequency
        total = self.max_length.in_batches(batches)
        epochs, rest = divmod(total, batches)
        return epochs * math.ceil(batches / k) + math.ceil(rest / k)
