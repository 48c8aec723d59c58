"""The managed training loop that runs a :class:`~trials.runtime.PyTorchTrial`.

Per batch: next batch -> device (with ``profiling.synthetic_data``, the first batch
again, already there) -> ``train_batch`` (under DDP's ``no_sync`` on all but
the last batch of an aggregation group, and under autocast) -> LR schedulers after an
optimizer step. Reports, validations and checkpoints happen only after an optimizer
step, so a checkpoint never holds half-aggregated gradients. Nothing per batch waits
for the device or the database: metrics stay on the device until a report, phase
timings are marks on the device's timeline read once it has passed them
(``_accelerator``, ``_timing``), and rank 0 writes through its recorder's thread, the
timing windows finished since the last report in that report's transaction. A
report's copy of the metrics to the host is the one regular wait for the device;
validations and checkpoints add theirs.

Step counting: ``step`` is the number of batches trained (per rank, each of
``per_slot_batch_size`` samples, i.e. global batches), the key of every metric,
timing and checkpoint.

A checkpoint (``state.pt``, see ``_checkpoint``) holds ``step``, the position to resume
from (``epoch_idx`` and ``batch_in_epoch``: the sampler skips that many batches of the
epoch's shuffled shard), ``last_validation_step``, the state dicts of every wrapped
model, optimizer and LR scheduler and of the GradScaler, and the RNG states (Python,
NumPy, torch, CUDA) of every rank, gathered to rank 0. A restore loads it on every
rank (so all ranks hold identical parameters and optimizer state, as after DDP's
initial broadcast), forgets what an earlier attempt recorded past ``step``, and sets
each rank's RNG right before the first batch: a deterministic run continues exactly
as if it had never stopped.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from trials.entrypoints import InvalidTrialError
from trials.runtime._checkpoint import (
    FORMAT_VERSION,
    CheckpointMismatchError,
    capture_rng_state,
    one_line,
    restore_rng_state,
)
from trials.runtime._context import LRStepMode, PyTorchTrialContext
from trials.runtime._data import ResumableDistributedSampler, ShardSampler, batch_sizes
from trials.runtime._distributed import gather_to_chief
from trials.runtime._metrics import MetricAccumulator, reduce_means, unpack_means
from trials.runtime._outcome import TrialOutcome
from trials.runtime._timing import (
    NO_PROFILER,
    PhaseProfiler,
    Profiler,
    TimingWindow,
    WindowedTimings,
)
from trials.runtime._trial import PyTorchTrial


@dataclass(frozen=True)
class Schedule:
    """The loop's lengths and periods, all in batches.

    Example:
        >>> s = Schedule(batches_per_epoch=10, max_batches=30, validation_every=10,
        ...              checkpoint_every=None, report_every=100, aggregation_frequency=4)
        >>> [b for b in range(10) if s.is_optimizer_step(b, b)]
        [3, 7, 9]
    """

    batches_per_epoch: int
    max_batches: int
    validation_every: int
    checkpoint_every: int | None
    report_every: int
    aggregation_frequency: int

    def is_optimizer_step(self, batch_in_epoch: int, step: int) -> bool:
        """Whether the batch at ``batch_in_epoch`` (``step`` batches trained before it)
        ends an aggregation group: every k-th batch, the epoch's last, the trial's last."""
        return (
            (batch_in_epoch + 1) % self.aggregation_frequency == 0
            or batch_in_epoch + 1 == self.batches_per_epoch
            or step + 1 >= self.max_batches
        )


class ManagedLoop:
    """Runs one trial class to its ``max_length`` (or until pruned or preempted)."""

    def __init__(self, trial_cls: type[PyTorchTrial], context: PyTorchTrialContext) -> None:
        self.context = context
        self.spec = context.spec
        self.trial = trial_cls(context)
        if not context.wrapped_models:
            raise InvalidTrialError(
                f"{trial_cls.__name__}: wrap at least one model with context.wrap_model in __init__"
            )
        self.device = context.device
        self.accelerator = context._accelerator
        self._build_data()
        self.step = 0
        self.epoch_idx = 0
        self.batch_in_epoch = 0
        self.last_validation_step = 0
        self.last_checkpoint_step = 0
        self.last_report_step = 0
        # A max_length in slot-seconds was spent at the last validation: training ends.
        self.compute_spent = False
        self._restored_rng: Any = None
        self._train_metrics = MetricAccumulator()
        self.profiler = self._profiler()
        # Finished timing windows, recorded with the next training report: one
        # transaction of rank 0's recorder instead of one per window.
        self._windows: list[TimingWindow] = []
        restored = context._restored_checkpoint()
        if restored is not None:
            self._restore(restored.state, restored.location)

    # -- set-up --------------------------------------------------------------------------

    def _profiler(self) -> Profiler:
        """Rank 0's phase timings when profiling is on; the stand-in elsewhere."""
        profiling = self.spec.profiling
        if not (profiling.enabled and self.context.is_chief):
            return NO_PROFILER
        return PhaseProfiler(
            WindowedTimings(profiling.window_batches),
            sample_every=self.accelerator.timed_every(profiling.sync_every),
            clock=self.accelerator.phase_clock(),
        )

    def _build_data(self) -> None:
        ctx = self.context
        info = ctx.distributed
        train_spec = self.trial.build_training_data_loader()
        val_spec = self.trial.build_validation_data_loader()
        train_len = len(train_spec.dataset)  # type: ignore[arg-type]
        val_len = len(val_spec.dataset)  # type: ignore[arg-type]
        if train_len < info.world_size or val_len < info.world_size:
            raise InvalidTrialError(
                f"data: the training ({train_len}) and validation ({val_len}) sets need at least "
                f"one sample per slot ({info.world_size})"
            )
        self.train_sampler = ResumableDistributedSampler(
            train_spec.dataset,
            num_replicas=info.world_size,
            rank=info.rank,
            shuffle=train_spec.shuffle,
            seed=ctx.seed,
        )
        self._loader_generator = torch.Generator()
        self.train_loader = train_spec.build(
            self.train_sampler, ctx.per_slot_batch_size, self._loader_generator
        )
        self.train_batch_size = self.train_loader.batch_size or ctx.per_slot_batch_size
        batches = len(self.train_loader)
        if batches < 1:
            raise InvalidTrialError(
                f"data: the training set ({train_len} samples) makes no batch of "
                f"{self.train_batch_size} per slot"
            )
        val_sampler = ShardSampler(val_len, num_replicas=info.world_size, rank=info.rank)
        self.val_loader = val_spec.build(val_sampler, ctx.per_slot_batch_size, torch.Generator())
        self.val_batch_sizes = batch_sizes(
            len(val_sampler),
            self.val_loader.batch_size or ctx.per_slot_batch_size,
            val_spec.drop_last,
        )
        spec = self.spec
        checkpoint_every = (
            spec.min_checkpoint_period.in_batches(batches) if spec.min_checkpoint_period else None
        )
        self.schedule = Schedule(
            batches_per_epoch=batches,
            max_batches=spec.max_length.in_batches(batches),
            validation_every=spec.min_validation_period.in_batches(batches),
            checkpoint_every=checkpoint_every,
            report_every=max(1, int(getattr(self.trial, "scheduling_unit", 100))),
            aggregation_frequency=spec.optimizations.aggregation_frequency,
        )

    # -- checkpoints -------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        ctx = self.context
        return {
            "format": FORMAT_VERSION,
            "kind": "managed",
            "step": self.step,
            "epoch_idx": self.epoch_idx,
            "batch_in_epoch": self.batch_in_epoch,
            "last_validation_step": self.last_validation_step,
            "world_size": ctx.world_size,
            "models": [m.state_dict() for m in ctx.models],
            "optimizers": [o.state_dict() for o in ctx.optimizers],
            "lr_schedulers": [s.state_dict() for s, _ in ctx.lr_schedulers],
            "grad_scaler": ctx.grad_scaler.state_dict() if ctx.grad_scaler is not None else None,
        }

    def _checkpoint(self) -> None:
        # Every rank's RNG goes into the checkpoint, so a restore resumes each rank's stream.
        rng_states = gather_to_chief(capture_rng_state(self.device))
        self.context._write_checkpoint(
            lambda: {**self._state(), "rng": rng_states},
            steps_completed=self.step,
            epoch=self.step / self.schedule.batches_per_epoch,
        )
        self.last_checkpoint_step = self.step

    def _restore(self, state: dict[str, Any], location: str) -> None:
        """Take ``state`` (the checkpoint at ``location``, intact) into the trial.

        A checkpoint the trial's code no longer fits (other shapes, another number of
        models or optimizers) raises :class:`CheckpointMismatchError` with the cause on
        one line: the attempt fails, as every older checkpoint would.
        """
        ctx = self.context
        if state.get("kind") != "managed":
            raise CheckpointMismatchError(
                f"checkpoint {location} is not a checkpoint of the managed loop"
            )
        for what, saved, live in (
            ("models", state["models"], ctx.models),
            ("optimizers", state["optimizers"], ctx.optimizers),
            ("lr_schedulers", state["lr_schedulers"], ctx.lr_schedulers),
        ):
            if len(saved) != len(live):
                raise CheckpointMismatchError(
                    f"checkpoint {location} does not fit the trial: it holds {len(saved)} "
                    f"{what}, the trial wraps {len(live)}"
                )
        try:
            for model, model_state in zip(ctx.models, state["models"], strict=True):
                model.load_state_dict(model_state)
            # Optimizers before schedulers: a scheduler's state refers to its optimizer's rates.
            for optimizer, opt_state in zip(ctx.optimizers, state["optimizers"], strict=True):
                optimizer.load_state_dict(opt_state)
            for (scheduler, _), sched_state in zip(
                ctx.lr_schedulers, state["lr_schedulers"], strict=True
            ):
                scheduler.load_state_dict(sched_state)
            if ctx.grad_scaler is not None and state.get("grad_scaler"):
                ctx.grad_scaler.load_state_dict(state["grad_scaler"])
        except (RuntimeError, ValueError, KeyError, TypeError) as error:
            raise CheckpointMismatchError(
                f"checkpoint {location} does not fit the trial: {one_line(error)}"
            ) from error
        self.step = int(state["step"])
        self.epoch_idx = int(state["epoch_idx"])
        self.batch_in_epoch = int(state["batch_in_epoch"])
        if self.batch_in_epoch >= self.schedule.batches_per_epoch:
            self.epoch_idx, self.batch_in_epoch = self.epoch_idx + 1, 0
        self.last_validation_step = int(state.get("last_validation_step", self.step))
        self.last_checkpoint_step = self.step
        self.last_report_step = self.step
        rng = state.get("rng") or []
        if ctx.rank < len(rng) and state.get("world_size") == ctx.world_size:
            # Applied right before the first batch, after everything that draws at set-up.
            self._restored_rng = rng[ctx.rank]
        # The profiling window starts at the restored step (its samples are none yet).
        self.profiler.flush(self.step)
        ctx._recorder.rewind(self.step)
        ctx.steps_reported = self.step

    # -- reports and validation -------------------------------------------------------------

    def _report_training(self) -> bool:
        """Record the training metrics since the last report; whether preemption is asked."""
        ctx = self.context
        profiler = self.profiler
        accumulator = self._train_metrics
        # Rank 0's answer reaches every rank in this report's collective.
        preempt = 1.0 if ctx._preemption.requested() else 0.0
        names = accumulator.names()
        packed = reduce_means(
            accumulator.sums(self.device),
            accumulator.weight,
            contribute=self.spec.optimizations.average_training_metrics or ctx.is_chief,
            extras=(preempt,),
        )
        profiler.lap("reduce_metrics")
        host = self.accelerator.to_host(packed)
        profiler.lap("from_device")
        means, _, extras = unpack_means(names, host)
        if self._windows:
            ctx._recorder.timings(self._windows)
            self._windows = []
        ctx._recorder.training_metrics(
            self.step, self.step / self.schedule.batches_per_epoch, means
        )
        ctx.steps_reported = max(ctx.steps_reported, self.step)
        accumulator.reset()
        self.last_report_step = self.step
        return extras[0] > 0.5

    def _validate(self, *, final: bool) -> bool:
        """Validate on every rank, record, and ask the pruner; whether the trial is pruned."""
        ctx = self.context
        models = ctx.wrapped_models
        was_training = [m.training for m in models]
        for m in models:
            m.eval()
        accumulator = MetricAccumulator()
        with torch.no_grad():
            for batch_idx, batch in enumerate(self.val_loader):
                batch = self.accelerator.to_device(batch)
                with ctx.precision.autocast():
                    metrics = self.trial.evaluate_batch(batch, batch_idx)
                accumulator.add(metrics, weight=float(self.val_batch_sizes[batch_idx]))
        for m, training in zip(models, was_training, strict=True):
            m.train(training)
        packed = reduce_means(accumulator.sums(self.device), accumulator.weight)
        means, _, _ = unpack_means(accumulator.names(), self.accelerator.to_host(packed))
        self.last_validation_step = self.step
        ctx._record_validation(self.step, self.step / self.schedule.batches_per_epoch, means)
        if final:
            return False
        if ctx._compute_budget_spent():
            # The last validation of a trial whose max_length is compute: no pruning.
            self.compute_spent = True
            return False
        return ctx.should_prune()

    def _after_optimizer_step(self, epoch_end: bool) -> TrialOutcome | None:
        s = self.schedule
        step = self.step
        end = step >= s.max_batches
        validation_due = step - self.last_validation_step >= s.validation_every
        checkpoint_due = (
            s.checkpoint_every is not None
            and step - self.last_checkpoint_step >= s.checkpoint_every
        )
        preempt = False
        if (
            epoch_end
            or end
            or validation_due
            or checkpoint_due
            or step - self.last_report_step >= s.report_every
        ):
            preempt = self._report_training()
        if (
            (validation_due or end)
            and self.last_validation_step != step
            and self._validate(final=end)
        ):
            return TrialOutcome.PRUNED
        end = end or self.compute_spent
        if checkpoint_due or end or preempt:
            self._checkpoint()
        if preempt:
            return TrialOutcome.PREEMPTED
        if self.compute_spent:
            return TrialOutcome.FINISHED
        return None

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> TrialOutcome:
        ctx = self.context
        s = self.schedule
        trial = self.trial
        profiler = self.profiler
        accumulator = self._train_metrics
        to_device = self.accelerator.to_device
        # One null context, reused (it is reentrant): none is built per batch.
        nothing = contextlib.nullcontext()
        no_sync = ctx._no_sync if ctx.distributed.distributed else lambda: nothing
        autocast = ctx.precision.autocast if ctx.precision.enabled else lambda: nothing
        scaler = ctx.grad_scaler
        step_schedulers = [
            sched for sched, mode in ctx.lr_schedulers if mode is LRStepMode.OPTIMIZER_STEP
        ]
        epoch_schedulers = [sched for sched, mode in ctx.lr_schedulers if mode is LRStepMode.EPOCH]
        for m in ctx.wrapped_models:
            m.train()
        if self._restored_rng is not None:
            restore_rng_state(self._restored_rng, self.device)
        iterator = None
        synthetic = self.spec.profiling.synthetic_data
        held_batch: Any = None
        outcome: TrialOutcome | None = None
        # Start-up is over: the trial's compute counts from here.
        ctx._recorder.training_started()
        while self.step < s.max_batches:
            if iterator is None and held_batch is None:
                self.train_sampler.set_epoch(self.epoch_idx)
                self.train_sampler.set_start_index(self.batch_in_epoch * self.train_batch_size)
                self._loader_generator.manual_seed(ctx.seed * 7919 + self.epoch_idx)
                iterator = iter(self.train_loader)
            profiler.begin_batch()
            if held_batch is None:
                assert iterator is not None  # made above whenever no batch is held
                batch = next(iterator)
                profiler.lap("dataloader_next")
                batch = to_device(batch)
                profiler.lap("to_device")
                if synthetic:
                    held_batch = batch
            else:
                # profiling.synthetic_data: no input pipeline, its phases cost nothing.
                batch = held_batch
                profiler.lap("dataloader_next")
                profiler.lap("to_device")
            batch_in_epoch = self.batch_in_epoch
            is_step = s.is_optimizer_step(batch_in_epoch, self.step)
            ctx._is_optimizer_step = is_step
            ctx._batches_accumulated = batch_in_epoch % s.aggregation_frequency + 1
            with nothing if is_step else no_sync(), autocast():
                metrics = trial.train_batch(batch, self.epoch_idx, self.step)
            profiler.lap("train_batch")
            accumulator.add(metrics)
            self.step += 1
            self.batch_in_epoch += 1
            epoch_end = self.batch_in_epoch == s.batches_per_epoch
            if epoch_end:
                self.epoch_idx += 1
                self.batch_in_epoch = 0
                iterator = None
            if is_step:
                if scaler is not None:
                    scaler.update()
                for scheduler in step_schedulers:
                    scheduler.step()
                if epoch_end:
                    for scheduler in epoch_schedulers:
                        scheduler.step()
                profiler.lap("step_lr_schedulers")
                outcome = self._after_optimizer_step(epoch_end)
            windows = profiler.end_batch(self.step)
            if windows:
                self._windows += windows
            if outcome is not None:
                break
        ctx._recorder.timings(self._windows + profiler.flush(self.step))
        if outcome is None:
            outcome = TrialOutcome.FINISHED
        return outcome
