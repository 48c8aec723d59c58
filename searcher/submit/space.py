"""The search space: an experiment's ``hyperparameters`` as Optuna sees them.

Pure conversion, no I/O. One distribution per searched hyperparameter
(:func:`distributions`) is the single source for define-by-run suggestions
(:func:`suggest_hparams`), grid points (:func:`grid_search_space`) and the checks on
values a user enqueues (:func:`parse_enqueue_params`), so the three always agree.

Mapping, by hyperparameter type:

- ``const``: not an Optuna parameter; its value is copied into every trial's hparams.
- ``int``: ``IntDistribution(minval, maxval)``. With ``count`` the range is restricted to
  ``count`` evenly spaced integers (:meth:`trials.config.IntHP.points`) for every
  searcher, not only grid: when the points are equally spaced (``count - 1`` divides
  ``maxval - minval``) this is a stepped ``IntDistribution``, otherwise a
  ``CategoricalDistribution`` of the rounded points, e.g. ``minval: 1, maxval: 8,
  count: 4`` gives the choices ``1, 3, 6, 8``.
- ``double``: ``FloatDistribution(minval, maxval)``; ``log``: the same with ``log=True``.
  Their ``count`` only matters to the grid searcher.
- ``categorical``: ``CategoricalDistribution(vals)``. Optuna's choices must be
  ``None``, bool, int, float or str; when any value is a list or mapping (e.g. layer
  sizes ``[64, 32]``) every choice is stored as its JSON text and decoded back in the
  hparams a trial receives.

Example:
    >>> import optuna
    >>> from trials.config import parse_config
    >>> cfg = parse_config({
    ...     "name": "demo", "entrypoint": "model:Trial",
    ...     "hyperparameters": {
    ...         "global_batch_size": 64,
    ...         "layers": {"type": "categorical", "vals": [[64], [64, 32]]},
    ...     },
    ...     "searcher": {"name": "random", "metric": "val_loss", "max_trials": 2,
    ...                  "max_length": {"epochs": 1}},
    ... })
    >>> hparams = suggest_hparams(optuna.trial.FixedTrial({"layers": "[64, 32]"}),
    ...                           cfg.hyperparameters)
    >>> hparams
    {'global_batch_size': 64, 'layers': [64, 32]}
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trials.config import (
    CategoricalHP,
    ConfigError,
    ConstHP,
    DoubleHP,
    IntHP,
    LogHP,
    YamlError,
    grid_count_problems,
    parse_yaml,
)

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from trials.config import Hyperparameter

# The choice types Optuna stores as they are (``optuna.distributions.CategoricalChoiceType``).
_OPTUNA_CHOICE_TYPES = (type(None), bool, int, float, str)


def distributions(hyperparameters: Mapping[str, Hyperparameter]) -> dict[str, BaseDistribution]:
    """The Optuna distribution of every searched (non-constant) hyperparameter.

    Example:
        >>> from trials.config import LogHP
        >>> distributions({"lr": LogHP(type="log", minval=1e-4, maxval=1e-1)})
        {'lr': FloatDistribution(high=0.1, log=True, low=0.0001, step=None)}
    """
    return {
        name: _distribution(hp)
        for name, hp in hyperparameters.items()
        if not isinstance(hp, ConstHP)
    }


def suggest_hparams(
    trial: optuna.trial.BaseTrial, hyperparameters: Mapping[str, Hyperparameter]
) -> dict[str, Any]:
    """Suggest every hyperparameter on ``trial``; returns all of them, constants included.

    The result is what the trial's code receives (JSON-encoded categorical choices are
    decoded). Any :class:`optuna.trial.BaseTrial` works: a ``FixedTrial`` built from a
    stored trial's ``params`` rebuilds its hparams, e.g. when a search is resumed.

    Example:
        >>> import optuna
        >>> from trials.config import ConstHP, IntHP
        >>> hps = {"warmup": IntHP(type="int", minval=0, maxval=4, count=3),
        ...        "scaling": ConstHP(type="const", val="linear")}
        >>> suggest_hparams(optuna.trial.FixedTrial({"warmup": 2}), hps)
        {'warmup': 2, 'scaling': 'linear'}
    """
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    hparams: dict[str, Any] = {}
    for name, hp in hyperparameters.items():
        if isinstance(hp, ConstHP):
            # A copy: the trial may mutate its hparams, the frozen config must not change.
            hparams[name] = copy.deepcopy(hp.val)
            continue
        dist = _distribution(hp)
        value: Any
        if isinstance(dist, IntDistribution):
            value = trial.suggest_int(name, dist.low, dist.high, step=dist.step)
        elif isinstance(dist, FloatDistribution):
            value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
        else:
            assert isinstance(dist, CategoricalDistribution)
            value = trial.suggest_categorical(name, dist.choices)
        hparams[name] = _from_optuna(hp, value)
    return hparams


def grid_search_space(hyperparameters: Mapping[str, Hyperparameter]) -> dict[str, list[Any]]:
    """The points of each searched hyperparameter, for :class:`optuna.samplers.GridSampler`.

    ``count`` points for numeric ranges (evenly spaced, both ends included; geometric
    for ``log``; the midpoint for ``count: 1``; fewer when a float range is too narrow
    to hold ``count`` distinct numbers), every value of a categorical (in Optuna's
    representation, see the module docstring). Constants are left out: they
    are not Optuna parameters, never reach the sampler, and multiply the grid by one.
    Raises :class:`~trials.config.ConfigError` naming each numeric hyperparameter
    without ``count`` (a validated grid config never has one).

    Example:
        >>> from trials.config import DoubleHP, LogHP
        >>> grid_search_space({"lr": LogHP(type="log", minval=1e-3, maxval=1e-1, count=3),
        ...                    "dropout": DoubleHP(type="double", minval=0, maxval=0.5, count=2)})
        {'lr': [0.001, 0.01, 0.1], 'dropout': [0.0, 0.5]}
    """
    problems = grid_count_problems(hyperparameters)
    if problems:
        raise ConfigError(problems)
    grid: dict[str, list[Any]] = {}
    for name, hp in hyperparameters.items():
        if isinstance(hp, ConstHP):
            continue
        if isinstance(hp, IntHP):
            grid[name] = hp.values()
        elif isinstance(hp, (DoubleHP, LogHP)):
            assert hp.count is not None
            grid[name] = _float_points(hp.minval, hp.maxval, hp.count, log=isinstance(hp, LogHP))
        else:
            grid[name] = list(_choices(hp))
    return grid


def grid_size(hyperparameters: Mapping[str, Hyperparameter]) -> int:
    """How many distinct trials a grid search has (the product of the axes' lengths).

    Example:
        >>> from trials.config import CategoricalHP, IntHP
        >>> grid_size({"opt": CategoricalHP(type="categorical", vals=["sgd", "adamw"]),
        ...            "warmup": IntHP(type="int", minval=0, maxval=4, count=3)})
        6
    """
    return math.prod(len(points) for points in grid_search_space(hyperparameters).values())


def parse_enqueue_params(
    hyperparameters: Mapping[str, Hyperparameter],
    assignments: list[str],
    *,
    require_all: bool = False,
) -> dict[str, Any]:
    """Parse ``key=value`` words for :meth:`optuna.Study.enqueue_trial`.

    Values are read the way YAML reads them (``0.01``, ``64``, ``adamw``, ``[64, 32]``)
    and checked against the hyperparameter's range or choices; the result is in
    Optuna's representation, ready for ``enqueue_trial``. Hyperparameters left out are
    chosen by the sampler, except with ``require_all`` (Optuna's GridSampler needs every
    parameter of an enqueued trial). Constants cannot be set. Raises ``ValueError`` with
    one line naming the key and what is allowed.

    Example:
        >>> from trials.config import CategoricalHP, LogHP
        >>> hps = {"lr": LogHP(type="log", minval=1e-4, maxval=1e-1),
        ...        "opt": CategoricalHP(type="categorical", vals=["sgd", "adamw"])}
        >>> parse_enqueue_params(hps, ["lr=0.01", "opt=adamw"])
        {'lr': 0.01, 'opt': 'adamw'}
        >>> parse_enqueue_params(hps, ["lr=1"])
        Traceback (most recent call last):
        ...
        ValueError: lr: must be a number in [0.0001, 0.1] (log scale), got '1'
    """
    searched = [name for name, hp in hyperparameters.items() if not isinstance(hp, ConstHP)]
    allowed = ", ".join(searched) or "(none: every hyperparameter is a constant)"
    if not assignments:
        raise ValueError(f"enqueue: give at least one key=value; keys: {allowed}")
    params: dict[str, Any] = {}
    for word in assignments:
        key, sep, text = word.partition("=")
        key = key.strip()
        if not sep or not key:
            example = f"{searched[0]}=..." if searched else "key=value"
            raise ValueError(f"{word!r}: expected key=value, e.g. {example}")
        hp = hyperparameters.get(key)
        if hp is None:
            raise ValueError(f"{key}: unknown hyperparameter; allowed: {allowed}")
        if isinstance(hp, ConstHP):
            raise ValueError(
                f"{key}: is a constant ({hp.val!r}) in the experiment's config and cannot be "
                f"enqueued; allowed: {allowed}"
            )
        if key in params:
            raise ValueError(f"{key}: given more than once")
        params[key] = _parse_value(key, hp, text.strip())
    if require_all:
        missing = [name for name in searched if name not in params]
        if missing:
            raise ValueError(
                f"{', '.join(missing)}: missing; the grid searcher needs a value for every "
                "searched hyperparameter"
            )
    return params


def _distribution(hp: IntHP | DoubleHP | LogHP | CategoricalHP) -> BaseDistribution:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(hp, IntHP):
        points = hp.points()
        if points is None:
            return IntDistribution(hp.minval, hp.maxval)
        if len(points) == 1:
            return IntDistribution(points[0], points[0])
        step = points[1] - points[0]
        if all(b - a == step for a, b in itertools.pairwise(points)):
            return IntDistribution(points[0], points[-1], step=step)
        return CategoricalDistribution(points)
    if isinstance(hp, DoubleHP):
        return FloatDistribution(hp.minval, hp.maxval)
    if isinstance(hp, LogHP):
        return FloatDistribution(hp.minval, hp.maxval, log=True)
    return CategoricalDistribution(_choices(hp))


def _json_encoded(hp: CategoricalHP) -> bool:
    """Whether this categorical's choices are stored in Optuna as JSON text."""
    return not all(isinstance(val, _OPTUNA_CHOICE_TYPES) for val in hp.vals)


def _choices(hp: CategoricalHP) -> tuple[Any, ...]:
    # All or none are encoded, so the string "[1]" and the list [1] stay different.
    if _json_encoded(hp):
        return tuple(json.dumps(val) for val in hp.vals)
    return tuple(hp.vals)


def _from_optuna(hp: Hyperparameter, value: Any) -> Any:
    if isinstance(hp, CategoricalHP) and _json_encoded(hp):
        return json.loads(value)
    return value


def _float_points(low: float, high: float, count: int, *, log: bool) -> list[float]:
    if count == 1:
        inner = [math.sqrt(low * high) if log else (low + high) / 2]
    elif log:
        ratio = math.log(high / low)
        inner = [low * math.exp(ratio * k / (count - 1)) for k in range(1, count - 1)]
    else:
        inner = [low + (high - low) * k / (count - 1) for k in range(1, count - 1)]
    ends = [] if count == 1 else [float(low), float(high)]
    raw = [*ends[:1], *inner, *ends[1:]]
    # 12 significant digits shows 0.01, not 0.010000000000000002, in the UI; the clamp
    # and the exact ends keep every point inside Optuna's distribution.
    rounded = [*ends[:1], *(min(max(float(f"{p:.12g}"), low), high) for p in inner), *ends[1:]]
    points = rounded if len(set(rounded)) == len(set(raw)) else raw
    # A range narrower than count floats has fewer points; a repeat would rerun a trial.
    return list(dict.fromkeys(points))


def _parse_value(key: str, hp: IntHP | DoubleHP | LogHP | CategoricalHP, text: str) -> Any:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(hp, CategoricalHP):
        value = _read(text)
        for val, choice in zip(hp.vals, _choices(hp), strict=True):
            if _same(value, val) or (isinstance(val, str) and val == text):
                return choice
        shown = ", ".join(val if isinstance(val, str) else json.dumps(val) for val in hp.vals)
        raise ValueError(f"{key}: must be one of {shown}, got {text!r}")
    if isinstance(hp, IntHP):
        number = _read(text)
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        is_int = isinstance(number, int) and not isinstance(number, bool)
        dist = _distribution(hp)
        if isinstance(dist, CategoricalDistribution):
            if is_int and number in dist.choices:
                return number
            allowed = f"one of {', '.join(str(c) for c in dist.choices)}"
        else:
            assert isinstance(dist, IntDistribution)
            if is_int and dist.low <= number <= dist.high and (number - dist.low) % dist.step == 0:
                return number
            allowed = f"an integer in [{dist.low}, {dist.high}]"
            if dist.step != 1:
                allowed += f" in steps of {dist.step}"
        raise ValueError(f"{key}: must be {allowed}, got {text!r}")
    scale = " (log scale)" if isinstance(hp, LogHP) else ""
    number = _read(text)
    if (
        isinstance(number, (int, float))
        and not isinstance(number, bool)
        and hp.minval <= number <= hp.maxval
    ):
        return float(number)
    raise ValueError(f"{key}: must be a number in [{hp.minval}, {hp.maxval}]{scale}, got {text!r}")


def _read(text: str) -> Any:
    """A command-line value as YAML reads it, numbers in any Python spelling."""
    # PyYAML follows YAML 1.1, where `1e-3` is a string; Python's float() is not.
    for number_type in (int, float):
        try:
            return number_type(text)
        except ValueError:
            pass
    try:
        # The bounded reader: a few hundred bytes of aliases must not expand to gigabytes.
        return parse_yaml(text, source="value")
    except YamlError:  # Anything it refuses is compared as the text itself.
        return text


def _same(a: Any, b: Any) -> bool:
    """Equal as configuration values: ``1 == 1.0``, but ``True`` is not ``1``."""
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, numbers) and isinstance(b, numbers):
        return a == b
    return type(a) is type(b) and json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
