"""The experiment configuration: YAML in Determined's shape, validated by pydantic.

Every problem in a file becomes one line ``<field path>: <what is wrong and what is
allowed>``; :func:`load_config` raises :class:`ConfigError` holding all of them, so the
CLI prints them and exits 2 before anything touches the database.

Example:
    >>> cfg = parse_config({
    ...     "name": "demo", "entrypoint": "model:Trial",
    ...     "hyperparameters": {"global_batch_size": 64, "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1}},
    ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2, "max_length": {"epochs": 1}},
    ... })
    >>> cfg.searcher.max_trials
    2
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from trials.config._integrations import IntegrationsConfig, NotificationConfig
from trials.config._sections import (
    MAX_SLOT_SECONDS,
    STEPS_PER_SLOT_SECOND,
    CheckpointStorageConfig,
    Length,
    MaxLength,
    OptimizationsConfig,
    ProfilingConfig,
    slot_seconds_step,
)
from trials.config._shares import (
    ALLOWED_SHARES,
    ALLOWED_SLOTS_PER_TRIAL,
    SLOT_SHARES,
    share_problem,
)
from trials.config._validation import (
    INT32_MAX,
    VALUE_ERROR_PREFIX,
    ConfigModel,
    allowed_fields,
    field_path,
    format_error,
)
from trials.config._yaml import YamlError, read_yaml

SEARCHER_NAMES = ("random", "grid", "tpe", "cmaes", "gp", "nsga2")
PRUNER_NAMES = ("asha", "hyperband", "median", "none")
COST_OBJECTIVES = ("slot_seconds", "wall_seconds")

# Upper bounds: every number must fit its database column and its use, so a value that
# passes validation cannot fail later, after the experiment was written.
MAX_TRIALS = 1_000_000
# Optuna stores parameter values as 64-bit floats, exact for integers up to 2**53.
MAX_INT_HP = 2**53
# Points of one axis (``count``) and of a whole grid: Optuna's GridSampler lists them all.
MAX_COUNT = 10_000
MAX_GRID_POINTS = 1_000_000
MAX_RESTARTS = 10_000
# One week: longer than any step of a trial that still makes progress.
MAX_HANG_TIMEOUT_S = 604_800.0
# Determined's default priority (1..99, lower runs first): an experiment's, and the
# scheduler's for a request that names none.
DEFAULT_PRIORITY = 42
# Fair-share weight of an experiment, and of a queued trial that names none.
DEFAULT_WEIGHT = 1.0


class ConfigError(Exception):
    """A configuration that cannot run; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(ConfigModel):
    # Infinities and NaN pass ``gt``/``le`` checks oddly and overflow later (Optuna, SQL).
    model_config = ConfigDict(allow_inf_nan=False)


def _json_problem(value: Any) -> str | None:
    """Why ``value`` is not JSON data, or None when it is.

    Hyperparameter values are stored as JSON (trial rows, Optuna's tables) and shown in
    the UI, so YAML-only values (dates, sets, recursive aliases) are refused up front.
    """
    done: set[int] = set()  # Containers already checked: YAML aliases share nodes.
    path: set[int] = set()  # Containers on the current path: a repeat is a cycle.

    def check(node: Any) -> str | None:
        if isinstance(node, float) and not math.isfinite(node):
            # JSON has no infinities or NaN; PostgreSQL's JSON columns refuse them.
            return f"numbers must be finite (got {node})"
        if node is None or isinstance(node, (bool, int, float, str)):
            return None
        if not isinstance(node, (list, dict)):
            return f"{type(node).__name__} values cannot be stored"
        if id(node) in path:
            return "a value may not contain itself"
        if id(node) in done:
            return None
        path.add(id(node))
        if isinstance(node, dict):
            if not all(isinstance(key, str) for key in node):
                return "mapping keys must be strings"
            items: list[Any] = list(node.values())
        else:
            items = node
        for item in items:
            problem = check(item)
            if problem is not None:
                return problem
        path.discard(id(node))
        done.add(id(node))
        return None

    try:
        problem = check(value)
    except RecursionError:
        problem = "nested too deeply"
    if problem is None:
        return None
    return f"must be JSON data (null, booleans, numbers, strings, lists, mappings): {problem}"


class ConstHP(_Strict):
    type: Literal["const"]
    val: Any

    @field_validator("val")
    @classmethod
    def _json_value(cls, value: Any) -> Any:
        problem = _json_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class IntHP(_Strict):
    type: Literal["int"]
    minval: int = Field(ge=-MAX_INT_HP, le=MAX_INT_HP)
    maxval: int = Field(ge=-MAX_INT_HP, le=MAX_INT_HP)
    count: int | None = Field(default=None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _ordered(self) -> IntHP:
        if self.minval > self.maxval:
            raise ValueError(f"minval ({self.minval}) must not exceed maxval ({self.maxval})")
        return self

    def points(self) -> list[int] | None:
        """The ``count`` evenly spaced integers this range is restricted to.

        None means every integer in ``[minval, maxval]`` (no ``count``, or a ``count``
        at least as large as the range, as in Determined). Points are rounded half up
        and include both ends; ``count: 1`` is the midpoint.

        Example:
            >>> IntHP(type="int", minval=0, maxval=10, count=3).points()
            [0, 5, 10]
        """
        span = self.maxval - self.minval
        if self.count is None or self.count > span:
            return None
        if self.count == 1:
            return [self.minval + span // 2]
        gaps = self.count - 1
        # Integer arithmetic: round(minval + k * span / gaps) without float error.
        return [self.minval + (2 * k * span + gaps) // (2 * gaps) for k in range(self.count)]

    def values(self) -> list[int]:
        """Every integer a trial can get from this range."""
        points = self.points()
        return points if points is not None else list(range(self.minval, self.maxval + 1))


class DoubleHP(_Strict):
    type: Literal["double"]
    minval: float
    maxval: float
    count: int | None = Field(default=None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _ordered(self) -> DoubleHP:
        if not self.minval < self.maxval:
            raise ValueError(f"minval ({self.minval}) must be less than maxval ({self.maxval})")
        if not math.isfinite(self.maxval - self.minval):
            # Samplers draw minval + u * (maxval - minval), which would be infinite.
            raise ValueError(
                f"the range [{self.minval}, {self.maxval}] is too wide: maxval - minval "
                "must be a finite float"
            )
        return self


class LogHP(_Strict):
    """A log-uniform range; ``minval``/``maxval`` are the values themselves (not exponents)."""

    type: Literal["log"]
    minval: float = Field(gt=0)
    maxval: float = Field(gt=0)
    count: int | None = Field(default=None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _ordered(self) -> LogHP:
        if not self.minval < self.maxval:
            raise ValueError(f"minval ({self.minval}) must be less than maxval ({self.maxval})")
        return self


class CategoricalHP(_Strict):
    type: Literal["categorical"]
    vals: list[Any] = Field(min_length=1)

    @field_validator("vals")
    @classmethod
    def _json_distinct(cls, value: list[Any]) -> list[Any]:
        problem = _json_problem(value)
        if problem is not None:
            raise ValueError(problem)
        seen: set[str] = set()
        for val in value:
            key = json.dumps(val, sort_keys=True)
            if key in seen:
                raise ValueError(f"{val!r} is listed twice; each value must appear once")
            seen.add(key)
        return value


Hyperparameter = Annotated[
    ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP, Field(discriminator="type")
]
_HP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Hyperparameter)
HP_TYPES = ("const", "int", "double", "log", "categorical")


class PrunerConfig(_Strict):
    """Early stopping; the resource unit follows ``searcher.max_length`` unless ``resource``.

    ``resource: slot_seconds`` compares trials at equal compute (slots times training
    time) instead of equal epochs or batches; ``min_resource`` (and ``n_warmup_steps``)
    are then slot-seconds, a fraction allowed for ``min_resource``.
    """

    name: Literal["asha", "hyperband", "median", "none"] = "none"
    resource: Literal["slot_seconds"] | None = None
    # A whole number of epochs or batches (checked with the unit), else slot-seconds.
    min_resource: float = Field(default=1.0, gt=0, le=MAX_SLOT_SECONDS, allow_inf_nan=False)
    reduction_factor: int = Field(default=3, ge=2, le=1000)
    min_early_stopping_rate: int = Field(default=0, ge=0, le=100)
    n_startup_trials: int = Field(default=5, ge=0, le=MAX_TRIALS)
    n_warmup_steps: int = Field(default=0, ge=0, le=INT32_MAX)

    @field_serializer("min_resource")
    def _whole_as_integer(self, value: float) -> int | float:
        # Stored and shown as written: 1, not 1.0, for epochs and batches.
        return int(value) if value.is_integer() else value


class ObjectiveConfig(_Strict):
    """An extra objective measured by the platform, for cost-aware multi-objective search."""

    name: Literal["slot_seconds", "wall_seconds"]
    smaller_is_better: Literal[True] = True


class SearcherConfig(_Strict):
    name: Literal["random", "grid", "tpe", "cmaes", "gp", "nsga2"] = "tpe"
    metric: str = Field(min_length=1, max_length=200)
    smaller_is_better: bool = True
    max_trials: int = Field(ge=1, le=MAX_TRIALS)
    max_length: MaxLength
    max_concurrent_trials: int = Field(default=1, ge=1, le=MAX_TRIALS)
    # NumPy's seed range, which every Optuna sampler uses.
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    n_startup_trials: int = Field(default=10, ge=0, le=MAX_TRIALS)
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)
    objectives: list[ObjectiveConfig] = Field(default_factory=list)

    @field_validator("objectives", mode="before")
    @classmethod
    def _objective_names(cls, value: Any) -> Any:
        # Shorthand: `objectives: [slot_seconds]`.
        if not isinstance(value, list):
            return value
        return [{"name": item} if isinstance(item, str) else item for item in value]

    @model_validator(mode="after")
    def _multi_objective(self) -> SearcherConfig:
        if self.name == "nsga2" and not self.objectives:
            raise ValueError(
                "nsga2 is multi-objective: add 'objectives' (slot_seconds or wall_seconds)"
            )
        if self.objectives and self.name not in ("random", "tpe", "nsga2", "gp"):
            raise ValueError(
                f"{self.name} is single-objective; with 'objectives' use random, tpe, gp or nsga2"
            )
        self._check_resource()
        self._check_pareto_pruning()
        return self

    @property
    def directions(self) -> list[Literal["minimize", "maximize"]]:
        """The study's directions: the searcher metric's first, then each cost objective's
        (minimized)."""
        metric: Literal["minimize", "maximize"] = (
            "minimize" if self.smaller_is_better else "maximize"
        )
        costs: list[Literal["minimize", "maximize"]] = ["minimize"] * len(self.objectives)
        return [metric, *costs]

    @property
    def objective_names(self) -> list[str]:
        """The study's objectives by name: the searcher metric, then each cost objective."""
        return [self.metric, *(objective.name for objective in self.objectives)]

    @property
    def resource_unit(self) -> Literal["epochs", "batches", "slot_seconds"]:
        """The unit of the pruner's steps: ``pruner.resource``, else ``max_length``'s."""
        return self.pruner.resource or self.max_length.unit

    def _check_pareto_pruning(self) -> None:
        """A pruner that fits 'objectives': rungs ranked by Pareto fronts (MO-ASHA)."""
        if not self.objectives or self.pruner.name == "none":
            return
        if self.pruner.name == "median":
            raise ValueError(
                "pruner.name: median compares one metric with the median of the other "
                "trials' at the same step, and several objectives have no median; with "
                "'objectives' use asha or hyperband (rungs ranked by Pareto fronts) or none"
            )
        if self.resource_unit == "slot_seconds" and any(
            objective.name == "slot_seconds" for objective in self.objectives
        ):
            where = "pruner.resource" if self.pruner.resource else "max_length"
            raise ValueError(
                f"{where}: rungs in slot-seconds with the objective slot_seconds: every "
                "trial meets a rung at the same compute, so compute cannot rank them; "
                "put the rungs in epochs or batches (max_length's unit, no pruner.resource)"
            )

    def _check_resource(self) -> None:
        """The pruner's resource, ``min_resource`` and ``max_length`` fit together."""
        pruner, unit = self.pruner, self.resource_unit
        if pruner.resource is not None and pruner.name == "none":
            raise ValueError(
                "pruner.resource: slot_seconds is the unit of a pruner's rungs; "
                "set pruner.name to asha, hyperband or median, or leave resource out"
            )
        if unit == "slot_seconds":
            if slot_seconds_step(pruner.min_resource) < 1:
                raise ValueError(
                    f"pruner.min_resource ({pruner.min_resource:g} slot-seconds) must be at "
                    f"least {1 / STEPS_PER_SLOT_SECOND} slot-seconds"
                )
            if pruner.name == "hyperband" and self.max_length.unit != "slot_seconds":
                raise ValueError(
                    "max_length: hyperband with pruner.resource slot_seconds needs "
                    "max_length in the same unit, e.g. {slot_seconds: 600}"
                )
        elif not float(pruner.min_resource).is_integer():
            raise ValueError(
                f"pruner.min_resource ({pruner.min_resource:g}) must be a whole number of "
                f"{unit}; fractions only with pruner.resource: slot_seconds"
            )
        if (
            pruner.name in ("asha", "hyperband")
            and unit == self.max_length.unit
            and pruner.min_resource >= self.max_length.amount
        ):
            raise ValueError(
                f"pruner.min_resource ({pruner.min_resource:g}) must be less than "
                f"max_length ({self.max_length.amount:g} {self.max_length.unit}); "
                "otherwise no trial could be stopped early"
            )


class ResourcesConfig(_Strict):
    # Whole slots (an int), or a share of one slot (one of SLOT_SHARES) for a trial of
    # one rank: several such trials run on one slot at once (see trials.config._shares).
    slots_per_trial: int | float = 1
    resource_pool: str = Field(default="default", min_length=1, max_length=200)
    # Determined's convention: a lower number runs first (1..99).
    priority: int = Field(default=DEFAULT_PRIORITY, ge=1, le=99)
    # Determined's fair share: among experiments of equal priority, slots are divided
    # in proportion to their weights (and their demand).
    weight: float = Field(default=DEFAULT_WEIGHT, gt=0, le=1000)
    # Warm workers: a trial's torchrun job stays alive for the next trial of its shape.
    reuse_workers: bool = False
    # With reuse_workers: keep the entrypoint's module between trials instead of
    # re-importing it (its module globals then carry over: opt in knowingly).
    keep_entrypoint_module: bool = False
    # A slots_per_trial the pool cannot place runs on the largest size it can (an
    # example that shows DDP where two slots exist and still runs on one GPU); decided
    # once, when the run is submitted, and stored with the experiment.
    shrink_to_fit: bool = False

    @field_validator("slots_per_trial", mode="before")
    @classmethod
    def _whole_slots_or_a_share(cls, value: Any) -> int | float:
        # One message naming every allowed value, instead of pydantic's two for the union.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be {ALLOWED_SLOTS_PER_TRIAL}")
        problem = share_problem(value)
        if problem is not None:
            raise ValueError(problem)
        if value > INT32_MAX:
            raise ValueError(f"must be at most {INT32_MAX}")
        # 2.0 is 2 slots; a share stays the exact float it is.
        return value if value in SLOT_SHARES else int(value)

    @property
    def slot_share(self) -> float:
        """The part of each of its slots a trial uses: 1.0 (whole slots), or its share.

        Example:
            >>> ResourcesConfig(slots_per_trial=0.25).slot_share, ResourcesConfig().slot_share
            (0.25, 1.0)
        """
        return float(self.slots_per_trial) if self.slots_per_trial in SLOT_SHARES else 1.0

    @property
    def slots(self) -> int:
        """How many slots a trial spans (and ranks it runs): 1 for a share of one slot.

        Example:
            >>> ResourcesConfig(slots_per_trial=0.5).slots, ResourcesConfig(slots_per_trial=4).slots
            (1, 4)
        """
        return 1 if self.slots_per_trial in SLOT_SHARES else int(self.slots_per_trial)

    @model_validator(mode="after")
    def _keep_needs_reuse(self) -> ResourcesConfig:
        if self.keep_entrypoint_module and not self.reuse_workers:
            raise ValueError(
                "keep_entrypoint_module: only with reuse_workers: true (a cold trial "
                "always imports its module afresh)"
            )
        return self


class ExperimentConfig(_Strict):
    """A whole experiment; see the README's configuration reference."""

    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=10_000)
    entrypoint: str = Field(max_length=500)
    hyperparameters: dict[str, Hyperparameter]
    searcher: SearcherConfig
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)
    min_validation_period: Length = Field(default_factory=lambda: Length(epochs=1))
    min_checkpoint_period: Length | None = Field(default_factory=lambda: Length(epochs=1))
    checkpoint_storage: CheckpointStorageConfig = Field(default_factory=CheckpointStorageConfig)
    profiling: ProfilingConfig = Field(default_factory=ProfilingConfig)
    max_restarts: int = Field(default=5, ge=0, le=MAX_RESTARTS)
    hang_timeout_s: float | None = Field(default=600.0, gt=0, le=MAX_HANG_TIMEOUT_S)
    """Seconds, or null to disable: a trial whose rank 0 records no progress (metrics,
    checkpoint) for this long is ended and restarted (it counts as a failure for
    max_restarts)."""
    fail_fast_trials: int = Field(default=3, ge=0, le=MAX_TRIALS)
    """Stop the experiment with state ERROR when its first N trials all failed with the
    same error and none succeeded (a bug, not bad luck); 0 turns this off."""
    data: dict[str, Any] = Field(default_factory=dict)
    integrations: IntegrationsConfig = Field(default_factory=IntegrationsConfig)
    """Tools the driver logs the search to from the database (MLflow)."""
    notifications: list[NotificationConfig] = Field(default_factory=list, max_length=100)
    """Webhooks posted to on the search's events (besides the cluster file's)."""

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_shape(cls, value: str) -> str:
        module, sep, attr = value.partition(":")
        if not sep or not module or not attr:
            raise ValueError("must be 'module:ClassName', e.g. 'model:DigitsTrial'")
        return value

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _shorthand_consts(cls, value: Any) -> Any:
        # Determined allows a bare value for a constant: `lr_scaling: linear`.
        if not isinstance(value, dict):
            return value
        bad = [key for key in value if isinstance(key, str) and not key.isidentifier()]
        if bad:
            # Names become keyword-like keys in code (hparams["lr"]), Optuna and the UI.
            raise ValueError(
                f"{', '.join(repr(key) for key in bad)}: a hyperparameter name must be an "
                "identifier (letters, digits and _, not starting with a digit)"
            )
        return {
            key: hp if isinstance(hp, dict) else {"type": "const", "val": hp}
            for key, hp in value.items()
        }

    @field_validator("data")
    @classmethod
    def _json_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = _json_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _slots_hyperparameter(self) -> ExperimentConfig:
        hp = self.hyperparameters.get("slots_per_trial")
        if hp is None:
            return self
        if self.resources.slot_share < 1:
            raise ValueError(
                f"resources.slots_per_trial: a share of one slot "
                f"({self.resources.slots_per_trial:g}) is one size for every trial and cannot "
                "be combined with a search over hyperparameters.slots_per_trial; remove the "
                f"hyperparameter, or search whole numbers of slots (1, 2, ...)"
            )
        if self.resources.shrink_to_fit:
            raise ValueError(
                "hyperparameters.slots_per_trial: not with resources.shrink_to_fit, which "
                "shrinks resources.slots_per_trial only; every searched size must fit the pool"
            )
        if isinstance(hp, (DoubleHP, LogHP)):
            raise ValueError(
                "hyperparameters.slots_per_trial: must be an integer, or int/categorical of integers"
            )
        if isinstance(hp, IntHP) and hp.maxval - hp.minval >= _MAX_SLOT_CHOICES:
            raise ValueError(
                f"hyperparameters.slots_per_trial: an int range may span at most "
                f"{_MAX_SLOT_CHOICES} values; use categorical vals for the sizes you want"
            )
        for value in _possible_values(hp):
            if isinstance(value, float) and value in SLOT_SHARES:
                raise ValueError(
                    f"hyperparameters.slots_per_trial: a search over trial sizes takes whole "
                    f"numbers of slots (1, 2, ...), got {value!r}; a share of one slot "
                    f"({ALLOWED_SHARES}) goes in resources.slots_per_trial, for every trial "
                    "alike"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"hyperparameters.slots_per_trial: must be a positive integer, got {value!r}"
                )
        return self

    @model_validator(mode="after")
    def _grid_counts(self) -> ExperimentConfig:
        if self.searcher.name == "grid":
            problems = grid_count_problems(self.hyperparameters)
            if problems:
                raise ValueError("\n".join(problems))
            points = math.prod(
                _grid_axis_size(hp)
                for hp in self.hyperparameters.values()
                if not isinstance(hp, ConstHP)
            )
            if points > MAX_GRID_POINTS:
                raise ValueError(
                    f"hyperparameters: the grid has {points} points; the grid searcher "
                    f"takes at most {MAX_GRID_POINTS} (lower some counts)"
                )
        return self

    @model_validator(mode="after")
    def _batch_size(self) -> ExperimentConfig:
        gbs = self.hyperparameters.get("global_batch_size")
        if gbs is None:
            raise ValueError(
                "hyperparameters.global_batch_size: required (an integer, or int/categorical of integers)"
            )
        for value in _possible_values(gbs):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(
                    f"hyperparameters.global_batch_size: must be an integer, got {value!r}"
                )
            if value > INT32_MAX:
                raise ValueError(
                    f"hyperparameters.global_batch_size: must be at most {INT32_MAX}, got {value}"
                )
            for slots in self.possible_slots_per_trial():
                if value < slots:
                    raise ValueError(
                        f"hyperparameters.global_batch_size: {value} is smaller than "
                        f"slots_per_trial ({slots}); each slot needs at least one sample"
                    )
        return self

    def possible_slots_per_trial(self) -> list[int]:
        """Every slots_per_trial a trial may ask for (it can itself be a hyperparameter)."""
        hp = self.hyperparameters.get("slots_per_trial")
        if hp is None:
            return [self.resources.slots]
        if isinstance(hp, IntHP):
            return hp.values()
        return [int(v) for v in _possible_values(hp)]


# A slots_per_trial range is enumerated to check every size fits the pool.
_MAX_SLOT_CHOICES = 1024


def grid_count_problems(hyperparameters: Mapping[str, Any]) -> list[str]:
    """One line per numeric hyperparameter lacking the ``count`` a grid search needs.

    Example:
        >>> grid_count_problems({"lr": DoubleHP(type="double", minval=0.0, maxval=1.0)})
        ['hyperparameters.lr.count: required by the grid searcher (how many points between minval and maxval)']
    """
    return [
        f"hyperparameters.{name}.count: required by the grid searcher "
        "(how many points between minval and maxval)"
        for name, hp in hyperparameters.items()
        if isinstance(hp, (IntHP, DoubleHP, LogHP)) and hp.count is None
    ]


def _grid_axis_size(hp: IntHP | DoubleHP | LogHP | CategoricalHP) -> int:
    """An upper bound on one grid axis's points (close floats may merge into fewer)."""
    if isinstance(hp, IntHP):
        return len(hp.points() or range(hp.minval, hp.maxval + 1))
    if isinstance(hp, CategoricalHP):
        return len(hp.vals)
    return hp.count or 1


def _possible_values(hp: Any) -> list[Any]:
    """The values to check a hyperparameter against (for ranges, the two ends)."""
    if isinstance(hp, ConstHP):
        return [hp.val]
    if isinstance(hp, CategoricalHP):
        return list(hp.vals)
    return [hp.minval, hp.maxval]


def format_config_error(error: Any) -> str:
    """Hyperparameter-aware wording on top of the shared one-line pydantic format."""
    loc = tuple(error["loc"])
    # Discriminated unions put the chosen tag in the path; users never wrote it.
    user_loc = tuple(p for p in loc if not (isinstance(p, str) and p in HP_TYPES))
    path = field_path(user_loc)
    kind = error["type"]
    msg = error["msg"].removeprefix(VALUE_ERROR_PREFIX)
    if kind == "extra_forbidden":
        allowed = allowed_fields(ExperimentConfig, loc)
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"{path}: unknown field{hint}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return f"{path}.type: must be one of {', '.join(HP_TYPES)}"
    if msg.startswith(("hyperparameters.", "hyperparameters:")):
        return msg  # Whole-config checks already name their field.
    if kind == "model_type":
        # pydantic names our class ("instance of Length"); users wrote a YAML value.
        fields = allowed_fields(ExperimentConfig, (*loc, ""))
        shape = f" with fields {', '.join(fields)}" if fields else ""
        return f"{path}: must be a mapping{shape} (got {error.get('input')!r})"
    return format_error({**error, "loc": user_loc}, ExperimentConfig)


def parse_config(raw: Any, config_dir: Path | None = None) -> ExperimentConfig:
    """Validate a loaded YAML document; raises :class:`ConfigError` listing every problem."""
    if not isinstance(raw, dict):
        raise ConfigError(["<top level>: must be a mapping of fields (name, entrypoint, ...)"])
    try:
        config = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(sorted({format_config_error(e) for e in exc.errors()})) from None
    if config_dir is not None:
        module = config.entrypoint.partition(":")[0]
        module_path = config_dir / Path(*module.split("."))
        if not (
            module_path.with_suffix(".py").is_file() or (module_path / "__init__.py").is_file()
        ):
            raise ConfigError(
                [
                    f"entrypoint: module '{module}' not found in {config_dir} "
                    f"(expected {module_path.with_suffix('.py')})"
                ]
            )
    return config


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment YAML file (through the bounded YAML reader)."""
    path = Path(path)
    try:
        raw = read_yaml(path, source="config")
    except YamlError as exc:
        raise ConfigError(exc.problems) from None
    return parse_config(raw, config_dir=path.resolve().parent)
