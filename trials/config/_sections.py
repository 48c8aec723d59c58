"""Configuration sections that the in-worker runtime reads, and the rank's spec.

These are the parts of an experiment config that matter inside a rank, kept apart from
the experiment model (``_experiment``, composed from them) so a rank loads only these
at start-up.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from trials.config._storage_url import url_problem
from trials.config._validation import INT32_MAX, SECRET_INPUT_ERROR, ConfigModel

# A ``tensor_fusion_threshold`` (DDP's bucket size in MiB) above 1 TiB means a typo.
_MAX_BUCKET_MB = 1024.0 * 1024.0
# A day between system-metric samples is already longer than any useful profile.
_MAX_SAMPLE_INTERVAL_S = 86_400.0


class Length(ConfigModel):
    """A training length or period in Determined's units: ``{epochs: N}`` or ``{batches: N}``.

    Example:
        >>> Length(epochs=2).unit, Length(batches=50).value
        ('epochs', 50)
    """

    # Steps are stored in Integer columns; a million epochs is already beyond any run.
    epochs: int | None = Field(default=None, ge=1, le=1_000_000)
    batches: int | None = Field(default=None, ge=1, le=INT32_MAX)

    @model_validator(mode="after")
    def _exactly_one(self) -> Length:
        if (self.epochs is None) == (self.batches is None):
            raise ValueError("give exactly one of 'epochs' or 'batches' (a positive integer)")
        return self

    @property
    def unit(self) -> Literal["epochs", "batches"]:
        return "epochs" if self.epochs is not None else "batches"

    @property
    def value(self) -> int:
        return self.epochs if self.epochs is not None else self.batches  # type: ignore[return-value]

    def in_batches(self, batches_per_epoch: int) -> int:
        """This length in optimizer-visible batches, given the epoch size."""
        return self.value * batches_per_epoch if self.unit == "epochs" else self.value


#: Optuna's steps are integers: a step in slot-seconds (``searcher.pruner.resource:
#: slot_seconds``) is reported in hundredths of a slot-second, so short validations
#: (a tenth of a second each) still get steps of their own.
STEPS_PER_SLOT_SECOND = 100
# The largest slot-second count whose step fits Optuna's 32-bit step column: 5,965
# slot-hours, e.g. 64 GPUs for 93 hours.
MAX_SLOT_SECONDS = INT32_MAX // STEPS_PER_SLOT_SECOND


class MaxLength(Length):
    """``searcher.max_length``: a :class:`Length`, or ``{slot_seconds: N}`` of compute.

    ``slot_seconds`` is the trial's compute (slots times training time, restarts
    included, start-up excluded); training ends at the first validation that has spent
    it, so validations must come often enough (``min_validation_period``).

    Example:
        >>> MaxLength(slot_seconds=90.5).unit, MaxLength(epochs=3).value
        ('slot_seconds', 3)
    """

    slot_seconds: float | None = Field(
        default=None, gt=0, le=MAX_SLOT_SECONDS, allow_inf_nan=False
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> MaxLength:
        given = [v for v in (self.epochs, self.batches, self.slot_seconds) if v is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'epochs', 'batches' (a positive integer) "
                "or 'slot_seconds' (a positive number)"
            )
        return self

    @property
    def unit(self) -> Literal["epochs", "batches", "slot_seconds"]:  # type: ignore[override]
        if self.slot_seconds is not None:
            return "slot_seconds"
        return super().unit

    @property
    def amount(self) -> float:
        """The length in its unit, a fraction allowed (slot-seconds)."""
        return self.slot_seconds if self.slot_seconds is not None else float(self.value)

    @property
    def value(self) -> int:
        """The length in its unit; slot-seconds in Optuna's steps (:data:`STEPS_PER_SLOT_SECOND`)."""
        if self.slot_seconds is not None:
            return slot_seconds_step(self.slot_seconds)
        return super().value

    def in_batches(self, batches_per_epoch: int) -> int:
        """This length in batches; unbounded for slot-seconds (a validation ends it)."""
        if self.slot_seconds is not None:
            return INT32_MAX
        return super().in_batches(batches_per_epoch)


def slot_seconds_step(slot_seconds: float) -> int:
    """Optuna's step for ``slot_seconds`` of compute (rounded down to a hundredth).

    Example:
        >>> slot_seconds_step(2.519), slot_seconds_step(0.0)
        (251, 0)
    """
    return min(INT32_MAX, math.floor(slot_seconds * STEPS_PER_SLOT_SECOND + 1e-9))


class OptimizationsConfig(ConfigModel):
    """Determined's ``optimizations`` section, applied by the managed loop."""

    aggregation_frequency: int = Field(default=1, ge=1, le=INT32_MAX)
    average_aggregated_gradients: bool = True
    average_training_metrics: bool = True
    gradient_compression: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    powersgd_rank: int = Field(default=1, ge=1, le=1024)
    mixed_precision: Literal["none", "fp16", "bf16"] = "none"
    tensor_fusion_threshold: float = Field(
        default=64.0, gt=0, le=_MAX_BUCKET_MB, allow_inf_nan=False
    )
    #: Determined's name: at the start of training, time a few DDP bucket sizes and keep
    #: the fastest (instead of ``tensor_fusion_threshold``) for the rest of the trial.
    auto_tune_tensor_fusion: bool = False


class CheckpointStorageConfig(ConfigModel):
    """Where checkpoints go and how many survive garbage collection.

    ``path``: a folder (relative to the model directory unless absolute) or an fsspec
    URL such as ``s3://bucket/prefix`` (:mod:`trials.checkpoint_storage`); a URL with
    credentials in it is refused, so none is stored with the experiment.

    ``async_upload``: rank 0 serialises a checkpoint in memory and writes it on a
    background thread while training goes on; the checkpoint is recorded once its
    files (and, in a bucket, its manifest) are written. The next save and the trial's
    end wait for it, and a failed write fails the trial there. The price: twice the
    checkpoint's size in memory while it is written, and a crash during the write loses
    it (the restart uses the checkpoint before).
    """

    path: str = Field(default="./checkpoints", min_length=1, max_length=4096)
    save_trial_latest: int = Field(default=1, ge=0, le=INT32_MAX)
    save_trial_best: int = Field(default=1, ge=0, le=INT32_MAX)
    save_experiment_best: int = Field(default=0, ge=0, le=INT32_MAX)
    async_upload: bool = False

    @field_validator("path")
    @classmethod
    def _a_usable_url(cls, path: str) -> str:
        problem = url_problem(path)
        if problem is not None:
            # Not repeated in the message: the URL may carry a credential.
            raise PydanticCustomError(SECRET_INPUT_ERROR, problem)
        return path


class ProfilingConfig(ConfigModel):
    """Timings of the loop's phases, aggregated per window of batches."""

    enabled: bool = True
    window_batches: int = Field(default=50, ge=1, le=INT32_MAX)
    # On a GPU only every n-th batch is timed (CUDA events: a few microseconds of the
    # host each); nothing waits for the GPU to time it. On a CPU every batch is timed.
    sync_every: int = Field(default=10, ge=1, le=INT32_MAX)
    system_metrics_interval_s: float = Field(
        default=5.0, gt=0, le=_MAX_SAMPLE_INTERVAL_S, allow_inf_nan=False
    )
    #: Train on the first batch again and again, already on the device: the input
    #: pipeline's cost taken out (``slotsweep diagnose`` measures it so; the model
    #: learns nothing useful this way).
    synthetic_data: bool = False


# Successive halving and Hyperband, single- and multi-objective (the same rungs): each
# pruner's own defaults of min_resource and reduction_factor, where a spec leaves one out.
_RUNG_DEFAULTS: dict[str, tuple[int | str, int]] = {
    "SuccessiveHalvingPruner": ("auto", 4),
    "HyperbandPruner": (1, 3),
    "ParetoSuccessiveHalvingPruner": (1, 3),
    "ParetoHyperbandPruner": (1, 3),
}


class PrunerSpec(ConfigModel):
    """A pruner by class name and arguments: one of ``optuna.pruners``, or of
    :mod:`trials.pruning` for a multi-objective study (``ParetoSuccessiveHalvingPruner``,
    ``ParetoHyperbandPruner``).

    Optuna does not store a study's pruner, so every rank 0 that asks ``should_prune``
    rebuilds the driver's pruner from this (:func:`trials.pruning.build_pruner`).

    Example:
        >>> PrunerSpec(name="SuccessiveHalvingPruner", kwargs={"min_resource": 1}).name
        'SuccessiveHalvingPruner'
    """

    name: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    def may_prune(self, asked_at: int | None, step: int) -> bool:
        """Whether the pruner can answer yes at ``step``, last asked at ``asked_at``.

        Asking costs rank 0 a few database round trips that the training loop waits
        for; this rule lets it skip the validations where every answer is no, read
        from the pruners' own logic. Successive halving (ASHA) decides only when a
        trial reaches a rung it had not reached at the last ask (its rungs are
        ``min_resource * reduction_factor ** (min_early_stopping_rate + k)``; each
        Hyperband bracket is one with its own rate, so any power counts); the median
        and percentile pruners never before ``n_warmup_steps``. Anything else (a pruner
        this rule does not know, ``min_resource: auto``) is always asked.
        ``asked_at`` None: not asked yet in this process (a restarted trial asks at
        its first validation whatever rungs it passed before).

        Example:
            >>> asha = PrunerSpec(name="SuccessiveHalvingPruner",
            ...                   kwargs={"min_resource": 1, "reduction_factor": 3})
            >>> [step for step in range(1, 28) if asha.may_prune(step - 1, step)]
            [1, 3, 9, 27]
            >>> asha.may_prune(None, 5), asha.may_prune(2, 5), asha.may_prune(3, 8)
            (True, True, False)
        """
        kwargs = self.kwargs
        if self.name in ("MedianPruner", "PercentilePruner"):
            return step >= int(kwargs.get("n_warmup_steps", 0))
        if self.name not in _RUNG_DEFAULTS:
            return True
        halving = "Hyperband" not in self.name
        default_min, default_factor = _RUNG_DEFAULTS[self.name]
        min_resource = kwargs.get("min_resource", default_min)
        factor = kwargs.get("reduction_factor", default_factor)
        if not isinstance(min_resource, int | float) or min_resource <= 0 or factor <= 1:
            return True
        rung = min_resource * factor ** (
            kwargs.get("min_early_stopping_rate", 0) if halving else 0
        )
        while rung <= step:
            if asked_at is None or rung > asked_at:
                return True
            rung *= factor
        return False


class WarmSpec(ConfigModel):
    """How a rank of a warm job (``resources.reuse_workers``) waits for its next trial.

    Example:
        >>> WarmSpec(job_id=3).keep_entrypoint_module
        False
    """

    job_id: int
    #: Keep the user's entrypoint module between trials instead of re-importing it.
    keep_entrypoint_module: bool = False
    #: An idle job whose driver's heartbeat is older than this ends itself: nobody
    #: would hand it a trial or end it.
    driver_lease_s: float = Field(default=30.0, gt=0)


class RuntimeSpec(ConfigModel):
    """Everything a rank needs to run one trial, written by the driver as JSON.

    The driver passes the file's path in ``SLOTSWEEP_TRIAL_SPEC``; each rank reads it
    at start-up. It holds no secret beyond the database URL the driver itself uses.
    """

    db_url: str
    experiment_id: int
    #: The experiment's folder under ``checkpoint_storage.path``
    #: (``storage.Experiment.checkpoint_folder``).
    checkpoint_folder: str
    trial_id: int
    study_name: str
    optuna_trial_id: int
    optuna_trial_number: int
    attempt: int = 0
    entrypoint: str
    model_dir: str
    hparams: dict[str, Any]
    data: dict[str, Any] = Field(default_factory=dict)
    slots_per_trial: int = Field(ge=1)
    #: The part of its slot the trial uses: 1.0, or its share (``resources.slots_per_trial``
    #: 0.5, 0.25 or 0.125, a trial of one rank). Its compute counts at the share.
    slot_share: float = Field(default=1.0, gt=0, le=1)
    max_length: MaxLength
    searcher_metric: str
    smaller_is_better: bool = True
    pruning: bool = True
    pruner: PrunerSpec | None = None
    #: ``searcher.pruner.resource``: ``slot_seconds`` reports validations to Optuna at
    #: the compute spent, else (None) at ``max_length``'s unit.
    pruner_resource: Literal["slot_seconds"] | None = None
    #: ``searcher.objectives``' names: a multi-objective study, whose pruner ranks each
    #: validation's metric with what the trial had spent of each cost by then.
    objectives: list[Literal["slot_seconds", "wall_seconds"]] = Field(default_factory=list)
    min_validation_period: Length
    min_checkpoint_period: Length | None = None
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)
    checkpoint_storage: CheckpointStorageConfig = Field(default_factory=CheckpointStorageConfig)
    profiling: ProfilingConfig = Field(default_factory=ProfilingConfig)
    scratch_dir: str
    seed: int | None = None
    restore_checkpoint_path: str | None = None
    agent: str = "local"
    #: The trial's log file: a warm job's ranks write each trial's lines to its own log.
    log_path: str | None = None
    #: Set when the trial runs on a warm job (its ranks stay for the next trial).
    warm: WarmSpec | None = None

    @property
    def step_unit(self) -> Literal["epochs", "batches", "slot_seconds"]:
        """The unit of the steps reported to Optuna (and of a compute ``max_length``)."""
        return self.pruner_resource or self.max_length.unit

    @property
    def compute_slots(self) -> float:
        """What a second of the trial's training costs in slot-seconds: its slots at its share.

        Exact: a share is a power of two over 8 (:mod:`trials.config._shares`).
        """
        return self.slots_per_trial * self.slot_share
