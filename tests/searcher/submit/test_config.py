"""Experiment config validation: good files load, bad ones give one line per problem."""

from __future__ import annotations

import copy
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searcher.submit.samplers import build_pruner, build_sampler, study_directions
from searcher.submit.space import grid_size, suggest_hparams
from tests.conftest import EXAMPLES_DIR
from trials.config import ConfigError, ExperimentConfig, load_config, parse_config

_BASE: dict[str, Any] = {
    "name": "demo",
    "entrypoint": "model:Trial",
    "hyperparameters": {
        "global_batch_size": {"type": "categorical", "vals": [32, 64]},
        "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1, "count": 3},
        "warmup": {"type": "int", "minval": 0, "maxval": 2, "count": 3},
        "lr_scaling": "linear",
    },
    "searcher": {
        "name": "tpe",
        "metric": "val_loss",
        "max_trials": 4,
        "max_length": {"epochs": 3},
    },
}


def _write(folder: Path, document: Any) -> Path:
    """A config file (``document`` as YAML, or the text itself) with a model.py beside it."""
    (folder / "model.py").write_text("class Trial: ...\n")
    path = folder / "experiment.yaml"
    text = document if isinstance(document, str) else yaml.safe_dump(document)
    path.write_text(text)
    return path


def _with(change: dict[str, Any]) -> dict[str, Any]:
    """``_BASE`` with ``change`` merged in (``None`` deletes a key); dotted keys nest."""
    config = copy.deepcopy(_BASE)
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return config


def _problems(tmp_path: Path, document: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, document))
    return info.value.problems


def test_the_digits_example_loads() -> None:
    config = load_config(EXAMPLES_DIR / "digits" / "experiment.yaml")
    assert config.searcher.name == "tpe"
    assert config.hyperparameters["lr_scaling"].type == "const"


def test_a_full_config_loads_with_shorthands(tmp_path: Path) -> None:
    text = """
name: cost-aware
entrypoint: model:Trial
hyperparameters:
  global_batch_size: {type: categorical, vals: [64, 128]}
  slots_per_trial: {type: categorical, vals: [1, 2]}
  layers: {type: categorical, vals: [[64], [64, 32]]}
  lr: {type: log, minval: 1.0e-4, maxval: 1.0e-1}
  lr_scaling: linear
searcher:
  name: nsga2
  metric: val_accuracy
  smaller_is_better: false
  max_trials: 16
  max_length: {batches: 200}
  seed: 4294967295
  objectives: [slot_seconds]
"""
    config = load_config(_write(tmp_path, text))
    assert [o.name for o in config.searcher.objectives] == ["slot_seconds"]
    assert config.possible_slots_per_trial() == [1, 2]
    assert config.hyperparameters["lr_scaling"].val == "linear"  # type: ignore[union-attr]


def test_every_slots_per_trial_of_an_int_range_is_checked(tmp_path: Path) -> None:
    config = load_config(
        _write(
            tmp_path,
            _with({"hyperparameters.slots_per_trial": {"type": "int", "minval": 1, "maxval": 4}}),
        )
    )
    assert config.possible_slots_per_trial() == [1, 2, 3, 4]
    config = load_config(
        _write(
            tmp_path,
            _with(
                {
                    "hyperparameters.slots_per_trial": {
                        "type": "int",
                        "minval": 1,
                        "maxval": 8,
                        "count": 4,
                    }
                }
            ),
        )
    )
    assert config.possible_slots_per_trial() == [1, 3, 6, 8]


@pytest.mark.parametrize(
    ("change", "problems"),
    [
        (
            {"searcher.name": "bayes"},
            [
                "searcher.name: Input should be 'random', 'grid', 'tpe', 'cmaes', 'gp' or 'nsga2' (got 'bayes')"
            ],
        ),
        ({"searcher.metric": None}, ["searcher.metric: required field is missing"]),
        (
            {"searcher.metric": ""},
            ["searcher.metric: String should have at least 1 character (got '')"],
        ),
        (
            {"hyperparameters.lr": {"type": "log", "minval": 0.1, "maxval": 0.01}},
            ["hyperparameters.lr: minval (0.1) must be less than maxval (0.01)"],
        ),
        (
            {"hyperparameters.warmup": {"type": "int", "minval": 3, "maxval": 1}},
            ["hyperparameters.warmup: minval (3) must not exceed maxval (1)"],
        ),
        (
            {"hyperparameters.lr": {"type": "log", "minval": 0, "maxval": 1}},
            ["hyperparameters.lr.minval: Input should be greater than 0 (got 0)"],
        ),
        (
            {"hyperparameters.lr": {"type": "float", "minval": 0, "maxval": 1}},
            ["hyperparameters.lr.type: must be one of const, int, double, log, categorical"],
        ),
        (
            {"hyperparameters.lr": {"type": "double", "minval": 0, "maxval": 1, "steps": 3}},
            ["hyperparameters.lr.steps: unknown field; allowed: type, minval, maxval, count"],
        ),
        (
            {"searcher.max_trail": 3},
            [
                "searcher.max_trail: unknown field; allowed: name, metric, smaller_is_better, "
                "max_trials, max_length, max_concurrent_trials, seed, n_startup_trials, pruner, "
                "objectives"
            ],
        ),
        (
            {"resources.slots_per_trail": 2},
            [
                "resources.slots_per_trail: unknown field; allowed: slots_per_trial, "
                "resource_pool, priority, weight, reuse_workers, keep_entrypoint_module, "
                "shrink_to_fit"
            ],
        ),
        (
            # YAML's `true` is no number, though pydantic's lax mode reads it as 1.
            {"searcher.max_trials": True, "hyperparameters.lr.maxval": False},
            [
                "hyperparameters.lr.maxval: Input should be a valid number (got false)",
                "searcher.max_trials: Input should be a valid integer (got true)",
            ],
        ),
        (
            {"resources.keep_entrypoint_module": True},
            [
                "resources: keep_entrypoint_module: only with reuse_workers: true (a cold "
                "trial always imports its module afresh)"
            ],
        ),
        (
            {"resources.reuse_workers": "yes please"},
            ["resources.reuse_workers: must be true or false (got 'yes please')"],
        ),
        (
            {"resources.weight": 0},
            ["resources.weight: Input should be greater than 0 (got 0)"],
        ),
        (
            {"searcher.max_length": 3},
            [
                "searcher.max_length: must be a mapping with fields epochs, batches, "
                "slot_seconds (got 3)"
            ],
        ),
        (
            {"searcher.max_length": {"epochs": 2, "batches": 5}},
            [
                "searcher.max_length: give exactly one of 'epochs', 'batches' (a positive "
                "integer) or 'slot_seconds' (a positive number)"
            ],
        ),
        (
            {"searcher.seed": -1},
            ["searcher.seed: Input should be greater than or equal to 0 (got -1)"],
        ),
        (
            {"searcher.seed": 2**32},
            ["searcher.seed: Input should be less than or equal to 4294967295 (got 4294967296)"],
        ),
        (
            {"searcher.pruner": {"name": "asha", "min_resource": 3}},
            [
                "searcher: pruner.min_resource (3) must be less than max_length (3 epochs); "
                "otherwise no trial could be stopped early"
            ],
        ),
        (
            {"searcher.pruner": {"name": "asha", "min_resource": 0.5}},
            [
                "searcher: pruner.min_resource (0.5) must be a whole number of epochs; "
                "fractions only with pruner.resource: slot_seconds"
            ],
        ),
        (
            {"searcher.pruner": {"resource": "slot_seconds"}},
            [
                "searcher: pruner.resource: slot_seconds is the unit of a pruner's rungs; "
                "set pruner.name to asha, hyperband or median, or leave resource out"
            ],
        ),
        (
            {"searcher.pruner": {"name": "hyperband", "resource": "slot_seconds"}},
            [
                "searcher: max_length: hyperband with pruner.resource slot_seconds needs "
                "max_length in the same unit, e.g. {slot_seconds: 600}"
            ],
        ),
        (
            {
                "searcher.max_length": {"slot_seconds": 20},
                "searcher.pruner": {"name": "asha", "min_resource": 0.001},
            },
            [
                "searcher: pruner.min_resource (0.001 slot-seconds) must be at least "
                "0.01 slot-seconds"
            ],
        ),
        (
            {
                "searcher.max_length": {"slot_seconds": 20},
                "searcher.pruner": {"name": "asha", "min_resource": 20},
            },
            [
                "searcher: pruner.min_resource (20) must be less than max_length "
                "(20 slot_seconds); otherwise no trial could be stopped early"
            ],
        ),
        (
            {"min_validation_period": {"slot_seconds": 5}},
            ["min_validation_period.slot_seconds: unknown field; allowed: epochs, batches"],
        ),
        (
            {"searcher.objectives": ["slots"]},
            [
                "searcher.objectives.0.name: Input should be 'slot_seconds' or 'wall_seconds' (got 'slots')"
            ],
        ),
        (
            {"searcher.name": "cmaes", "searcher.objectives": ["slot_seconds"]},
            [
                "searcher: cmaes is single-objective; with 'objectives' use random, tpe, gp or nsga2"
            ],
        ),
        (
            {"searcher.objectives": ["slot_seconds"], "searcher.pruner": {"name": "median"}},
            [
                "searcher: pruner.name: median compares one metric with the median of the "
                "other trials' at the same step, and several objectives have no median; "
                "with 'objectives' use asha or hyperband (rungs ranked by Pareto fronts) or none"
            ],
        ),
        (
            {
                "searcher.objectives": ["slot_seconds"],
                "searcher.pruner": {"name": "asha", "resource": "slot_seconds"},
            },
            [
                "searcher: pruner.resource: rungs in slot-seconds with the objective "
                "slot_seconds: every trial meets a rung at the same compute, so compute "
                "cannot rank them; put the rungs in epochs or batches (max_length's unit, "
                "no pruner.resource)"
            ],
        ),
        (
            {"searcher.name": "nsga2"},
            [
                "searcher: nsga2 is multi-objective: add 'objectives' (slot_seconds or wall_seconds)"
            ],
        ),
        (
            {
                "searcher.name": "grid",
                "hyperparameters.lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1},
                "hyperparameters.warmup": {"type": "int", "minval": 0, "maxval": 2},
            },
            [
                "hyperparameters.lr.count: required by the grid searcher (how many points between minval and maxval)\n"
                "hyperparameters.warmup.count: required by the grid searcher (how many points between minval and maxval)"
            ],
        ),
        (
            {"hyperparameters.global_batch_size": None},
            [
                "hyperparameters.global_batch_size: required (an integer, or int/categorical of integers)"
            ],
        ),
        (
            {"hyperparameters.opt": {"type": "categorical", "vals": ["sgd", "adamw", "sgd"]}},
            ["hyperparameters.opt.vals: 'sgd' is listed twice; each value must appear once"],
        ),
        (
            {"hyperparameters.opt": {"type": "categorical", "vals": []}},
            ["hyperparameters.opt.vals: List should have at least 1 item after validation, not 0"],
        ),
        (
            {"hyperparameters.slots_per_trial": {"type": "double", "minval": 1, "maxval": 2}},
            [
                "hyperparameters.slots_per_trial: must be an integer, or int/categorical of integers"
            ],
        ),
        (
            {"hyperparameters.slots_per_trial": {"type": "categorical", "vals": [1, None]}},
            ["hyperparameters.slots_per_trial: must be a positive integer, got None"],
        ),
        (
            {"hyperparameters.slots_per_trial": 0},
            ["hyperparameters.slots_per_trial: must be a positive integer, got 0"],
        ),
        (
            {"hyperparameters.slots_per_trial": {"type": "int", "minval": 1, "maxval": 10**6}},
            [
                "hyperparameters.slots_per_trial: an int range may span at most 1024 values; "
                "use categorical vals for the sizes you want"
            ],
        ),
        (
            {"hyperparameters.global_batch_size": 1, "resources.slots_per_trial": 2},
            [
                "hyperparameters.global_batch_size: 1 is smaller than slots_per_trial (2); "
                "each slot needs at least one sample"
            ],
        ),
        (
            {"entrypoint": "model.Trial"},
            [
                "entrypoint: must be 'module:ClassName', e.g. 'model:DigitsTrial' (got 'model.Trial')"
            ],
        ),
    ],
)
def test_common_mistakes_get_one_clear_line_each(
    tmp_path: Path, change: dict[str, Any], problems: list[str]
) -> None:
    assert _problems(tmp_path, _with(change)) == problems


# Every boolean of the experiment config, and a value that would pass it (the other
# fields it needs set too).
_BOOLEAN_FIELDS: dict[str, dict[str, Any]] = {
    "searcher.smaller_is_better": {},
    "resources.reuse_workers": {},
    "resources.keep_entrypoint_module": {"resources.reuse_workers": True},
    "resources.shrink_to_fit": {},
    "optimizations.average_aggregated_gradients": {},
    "optimizations.average_training_metrics": {},
    "optimizations.auto_tune_tensor_fusion": {},
    "profiling.enabled": {},
    "profiling.synthetic_data": {},
    "checkpoint_storage.async_upload": {},
}


def test_every_boolean_field_is_listed() -> None:
    """A new boolean field of the config is added to the cases below, or this fails."""
    found = set()

    def walk(model: Any, prefix: str) -> None:
        for name, field in model.model_fields.items():
            if field.annotation is bool:
                found.add(f"{prefix}{name}")
            elif isinstance(field.annotation, type) and hasattr(field.annotation, "model_fields"):
                walk(field.annotation, f"{prefix}{name}.")

    walk(ExperimentConfig, "")
    assert found == set(_BOOLEAN_FIELDS)


@pytest.mark.parametrize("value", [1, 0, 1.0, "yes", "no", "true", "false", "on", "1"])
@pytest.mark.parametrize("field", sorted(_BOOLEAN_FIELDS))
def test_booleans_are_true_or_false_only(tmp_path: Path, field: str, value: Any) -> None:
    """pydantic's lax mode would read 1, "yes" and "true" as booleans; a config may not."""
    document = _with({**_BOOLEAN_FIELDS[field], field: value})
    assert _problems(tmp_path, document) == [f"{field}: must be true or false (got {value!r})"]
    for real in (True, False):
        load_config(_write(tmp_path, _with({**_BOOLEAN_FIELDS[field], field: real})))


def test_a_cost_objective_is_smaller_is_better_true_not_1(tmp_path: Path) -> None:
    objective = {"name": "slot_seconds", "smaller_is_better": 1}
    assert _problems(tmp_path, _with({"searcher.objectives": [objective]})) == [
        "searcher.objectives.0.smaller_is_better: Input should be True (got 1)"
    ]


def test_several_problems_are_all_listed(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path, _with({"searcher.name": "bayes", "max_restarts": -1, "searchr": {}})
    )
    assert [p.split(":")[0] for p in problems] == ["max_restarts", "searcher.name", "searchr"]


def test_values_that_cannot_be_stored_as_json_are_refused(tmp_path: Path) -> None:
    text = yaml.safe_dump(_BASE) + "data:\n  since: 2024-01-31\n"
    assert _problems(tmp_path, text) == [
        "data.since: 2024-01-31 reads as a YAML date; quote it ('2024-01-31') to use it as text"
    ]
    hp = yaml.safe_dump(_BASE).replace("lr_scaling: linear", "lr_scaling: &a [*a]")
    assert _problems(tmp_path, hp) == [
        "hyperparameters.lr_scaling.0: a value may not contain itself (alias *a)"
    ]
    # Built in Python rather than read from YAML, the same values are refused as well.
    with pytest.raises(ConfigError) as info:
        parse_config({**_BASE, "data": {"x": [1.0, float("inf")]}})
    assert info.value.problems == [
        "data: must be JSON data (null, booleans, numbers, strings, lists, mappings): "
        "numbers must be finite (got inf)"
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: [unclosed\n", "{file} is not valid YAML at line 2, column 1 (did not find "),
        (
            "name: a\n\tentrypoint: b\n",
            "{file} is not valid YAML at line 2, column 1 (found a tab",
        ),
        ("when: 2024-13-45\n", "when: 2024-13-45 reads as a YAML date; quote it"),
        ("n: !!int x\n", "n: 'x' is not a valid int"),
        ("n: !!python/object:os.system {}\n", "n: the YAML tag !!python/object:os.system is not"),
        ("a: 1\n---\nb: 2\n", "{file} holds more than one YAML document"),
        ("a: {b: 1, b: 2}\n", "a.b: key given twice (first at line 1); each key may appear once"),
        ("on: 1\n", "<top level>: the key 'on' is not text (YAML reads it as bool); quote it"),
        ("a: \x07\n", "{file} is not valid YAML (a control character or binary data at"),
        ("a: !!binary aGk=\n", "a: the YAML tag !!binary is not supported"),
        ("a: *nowhere\n", "a: alias *nowhere refers to no anchor &nowhere before it"),
        ("a: " + "[" * 70 + "]" * 70 + "\n", "nested more than 64 levels deep"),
        ("", "<top level>: must be a mapping of fields (name, entrypoint, ...)"),
        ("- name: a\n", "<top level>: must be a mapping of fields (name, entrypoint, ...)"),
    ],
)
def test_bad_yaml_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    problems = _problems(tmp_path, text)
    assert len(problems) == 1, problems
    assert problem.format(file=f"config: {tmp_path / 'experiment.yaml'}") in problems[0]


def test_yaml_merge_keys_and_aliases_are_expanded_into_copies(tmp_path: Path) -> None:
    text = yaml.safe_dump(_BASE) + (
        "data:\n  base: &b {layers: [64, 32], dropout: 0.1}\n"
        "  wide: {<<: *b, dropout: 0.2}\n  same: *b\n"
    )
    config = load_config(_write(tmp_path, text))
    assert config.data["wide"] == {"layers": [64, 32], "dropout": 0.2}
    assert config.data["same"] == config.data["base"]
    assert config.data["same"] is not config.data["base"]


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert info.value.problems == [
        f"config: cannot read {tmp_path / 'missing.yaml'}: No such file or directory"
    ]
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError) as info:
        load_config(binary)
    assert info.value.problems == [f"config: {binary} is not UTF-8 text"]


def test_the_entrypoint_module_must_exist(tmp_path: Path) -> None:
    path = _write(tmp_path, _with({"entrypoint": "models.mlp:Trial"}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        f"entrypoint: module 'models.mlp' not found in {tmp_path} "
        f"(expected {tmp_path / 'models' / 'mlp.py'})"
    ]


# Fuzzing: whatever the file holds, load_config returns a usable config or raises
# ConfigError; it never raises anything else.

_WORDS = st.sampled_from(
    [
        "random",
        "grid",
        "tpe",
        "cmaes",
        "gp",
        "nsga2",
        "asha",
        "hyperband",
        "median",
        "none",
        "const",
        "int",
        "double",
        "log",
        "categorical",
        "slot_seconds",
        "wall_seconds",
        "val_loss",
        "model:Trial",
        "",
        "x",
    ]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | _WORDS
    | st.text(max_size=4)
    | st.dates()
)
_SHAPES = st.sampled_from(
    [
        {"epochs": 2},
        {"batches": 5},
        {"type": "int", "minval": 0, "maxval": 3},
        {"type": "int", "minval": 1, "maxval": 4, "count": 3},
        {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 2},
        {"type": "log", "minval": 1e-3, "maxval": 1.0},
        {"type": "categorical", "vals": [1, 2]},
        {"type": "categorical", "vals": [[1], {"a": None}]},
        {"type": "const", "val": 8},
        {"name": "asha", "min_resource": 1},
        {"name": "hyperband", "min_resource": 1, "reduction_factor": 2},
        {"name": "median", "n_warmup_steps": 1},
        ["slot_seconds"],
        [{"name": "wall_seconds"}],
    ]
)
_VALUES = st.recursive(
    _SCALARS | _SHAPES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_WORDS | st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=8,
)
_PATHS = [
    "name",
    "description",
    "entrypoint",
    "hyperparameters",
    "hyperparameters.global_batch_size",
    "hyperparameters.lr",
    "hyperparameters.lr.type",
    "hyperparameters.lr.minval",
    "hyperparameters.lr.maxval",
    "hyperparameters.lr.count",
    "hyperparameters.warmup",
    "hyperparameters.warmup.count",
    "hyperparameters.slots_per_trial",
    "hyperparameters.new",
    "searcher",
    "searcher.name",
    "searcher.metric",
    "searcher.smaller_is_better",
    "searcher.max_trials",
    "searcher.max_length",
    "searcher.max_length.epochs",
    "searcher.max_concurrent_trials",
    "searcher.seed",
    "searcher.n_startup_trials",
    "searcher.pruner",
    "searcher.pruner.name",
    "searcher.pruner.min_resource",
    "searcher.pruner.reduction_factor",
    "searcher.objectives",
    "resources",
    "resources.slots_per_trial",
    "resources.priority",
    "optimizations",
    "optimizations.mixed_precision",
    "min_validation_period",
    "min_checkpoint_period",
    "checkpoint_storage",
    "checkpoint_storage.path",
    "profiling",
    "max_restarts",
    "data",
    "unknown",
]
_CHANGES = st.dictionaries(st.sampled_from(_PATHS), _VALUES | st.none(), max_size=4)


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node: Any = config
    for part in parents:
        if not isinstance(node, dict):
            return
        node = node.setdefault(part, {})
    if not isinstance(node, dict):
        return
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value


def _assert_usable(config: ExperimentConfig) -> None:
    """What the driver does with an accepted config must work too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. CMA-ES on a one-dimensional space
        study = optuna.create_study(
            sampler=build_sampler(config, trials_so_far=1),
            pruner=build_pruner(config),
            directions=study_directions(config),
        )
        if config.searcher.name == "grid":
            assert grid_size(config.hyperparameters) >= 1
        trial = study.ask()
        hparams = suggest_hparams(trial, config.hyperparameters)
    assert set(hparams) == set(config.hyperparameters)
    assert isinstance(hparams["global_batch_size"], int)
    slots = config.possible_slots_per_trial()
    assert slots and all(isinstance(n, int) and n >= 1 for n in slots)
    if "slots_per_trial" in hparams:
        assert hparams["slots_per_trial"] in slots


def _load_or_config_error(document: Any) -> ExperimentConfig | None:
    with tempfile.TemporaryDirectory() as folder:
        try:
            path = _write(Path(folder), document)
        except yaml.YAMLError:
            return None  # Not representable as YAML; nothing to load.
        try:
            return load_config(path)
        except ConfigError as exc:
            assert exc.problems
            assert all(line.strip() and ": " in line for line in exc.problems)
            return None


_quiet = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@_quiet
@given(changes=_CHANGES)
def test_any_mutated_config_loads_or_raises_config_error(changes: dict[str, Any]) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    config_dict = copy.deepcopy(_BASE)
    for path, value in changes.items():
        _set(config_dict, path, value)
    config = _load_or_config_error(config_dict)
    if config is not None:
        _assert_usable(config)


@_quiet
@given(document=_VALUES)
def test_any_yaml_document_loads_or_raises_config_error(document: Any) -> None:
    assert _load_or_config_error(document) is None


@_quiet
@given(
    text=st.text(
        alphabet=st.sampled_from(list("ab:-[]{}&*!|>'\"#%@ \n\t,?0123456789.")), max_size=40
    )
)
def test_any_text_loads_or_raises_config_error(text: str) -> None:
    assert _load_or_config_error(text) is None


_NUMERIC_HPS = st.sampled_from(
    [
        {"type": "int", "minval": 0, "maxval": 3},
        {"type": "int", "minval": 0, "maxval": 9, "count": 4},
        {"type": "double", "minval": 0.0, "maxval": 0.5},
        {"type": "double", "minval": 0.0, "maxval": 0.5, "count": 3},
        {"type": "log", "minval": 1e-4, "maxval": 1e-1},
        {"type": "log", "minval": 1e-4, "maxval": 1e-1, "count": 1},
    ]
)
_OTHER_HPS = st.sampled_from(
    [
        "linear",
        {"type": "const", "val": {"milestones": [1, 2]}},
        {"type": "categorical", "vals": ["sgd", "adamw"]},
        {"type": "categorical", "vals": [[64], [64, 32], None]},
    ]
)


@_quiet
@given(
    searcher=st.fixed_dictionaries(
        {
            "name": st.sampled_from(["random", "grid", "tpe", "cmaes", "gp", "nsga2"]),
            "metric": st.just("val_loss"),
            "max_trials": st.integers(1, 40),
            "max_length": st.sampled_from([{"epochs": 1}, {"epochs": 4}, {"batches": 30}]),
            "max_concurrent_trials": st.integers(1, 3),
            "smaller_is_better": st.booleans(),
        },
        optional={
            "seed": st.integers(0, 2**32 - 1),
            "n_startup_trials": st.integers(0, 5),
            "pruner": st.fixed_dictionaries(
                {"name": st.sampled_from(["asha", "hyperband", "median", "none"])},
                optional={
                    "min_resource": st.integers(1, 5),
                    "reduction_factor": st.integers(2, 4),
                    "n_warmup_steps": st.integers(0, 3),
                },
            ),
            "objectives": st.sampled_from(
                [[], ["slot_seconds"], ["wall_seconds", "slot_seconds"]]
            ),
        },
    ),
    batch=st.sampled_from(
        [
            64,
            {"type": "categorical", "vals": [32, 64]},
            {"type": "int", "minval": 8, "maxval": 64, "count": 3},
        ]
    ),
    slots=st.none()
    | st.sampled_from(
        [2, {"type": "categorical", "vals": [1, 2]}, {"type": "int", "minval": 1, "maxval": 3}]
    ),
    numeric=st.lists(_NUMERIC_HPS, max_size=3),
    other=st.lists(_OTHER_HPS, max_size=2),
)
def test_any_searcher_setup_is_usable_or_explained(
    searcher: dict[str, Any],
    batch: Any,
    slots: Any,
    numeric: list[dict[str, Any]],
    other: list[Any],
) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    hyperparameters: dict[str, Any] = {"global_batch_size": batch}
    if slots is not None:
        hyperparameters["slots_per_trial"] = slots
    hyperparameters.update({f"n{i}": hp for i, hp in enumerate(numeric)})
    hyperparameters.update({f"o{i}": hp for i, hp in enumerate(other)})
    document = {
        "name": "fuzz",
        "entrypoint": "model:Trial",
        "hyperparameters": hyperparameters,
        "searcher": searcher,
    }
    config = _load_or_config_error(document)
    if config is not None:
        _assert_usable(config)


# Values that used to pass validation and fail later, after the database was written.


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"hyperparameters.lr.maxval": float("inf")},
            "hyperparameters.lr.maxval: Input should be a finite number",
        ),
        (
            {"hyperparameters.lr.minval": float("nan")},
            "hyperparameters.lr.minval: Input should be a finite number",
        ),
        ({"searcher.max_trials": 1e100}, "searcher.max_trials: "),
        (
            {"searcher.max_trials": 10**30},
            "searcher.max_trials: Input should be less than or equal to 1000000",
        ),
        (
            {"profiling": {"system_metrics_interval_s": float("inf")}},
            "profiling.system_metrics_interval_s: Input should be a finite number",
        ),
        (
            {"optimizations": {"tensor_fusion_threshold": float("inf")}},
            "optimizations.tensor_fusion_threshold: Input should be a finite number",
        ),
        (
            {"hyperparameters.global_batch_size": 10**30},
            "hyperparameters.global_batch_size: must be at most 2147483647, got 10000000000",
        ),
        (
            {"hyperparameters.warmup.maxval": 2**60},
            "hyperparameters.warmup.maxval: Input should be less than or equal to 9007199254740992",
        ),
        (
            {"hyperparameters.warmup.count": 10**9},
            "hyperparameters.warmup.count: Input should be less than or equal to 10000",
        ),
        (
            {"hyperparameters.d": {"type": "double", "minval": -1e308, "maxval": 1e308}},
            "hyperparameters.d: the range [-1e+308, 1e+308] is too wide",
        ),
        (
            {"hyperparameters.c": {"type": "categorical", "vals": [1.0, float("inf")]}},
            "hyperparameters.c.vals: must be JSON data (null, booleans, numbers, strings, lists, mappings): numbers must be finite (got inf)",
        ),
        (
            {"searcher.max_length": {"epochs": 10**12}},
            "searcher.max_length.epochs: Input should be less than or equal to 1000000",
        ),
        ({"max_restarts": 10**9}, "max_restarts: Input should be less than or equal to 10000"),
        (
            {"hyperparameters.my-lr": 0.1},
            "hyperparameters: 'my-lr': a hyperparameter name must be an identifier",
        ),
        (
            {"hyperparameters.": 0.1},
            "hyperparameters: '': a hyperparameter name must be an identifier",
        ),
        (
            {"hyperparameters.1st": 0.1},
            "hyperparameters: '1st': a hyperparameter name must be an identifier",
        ),
    ],
)
def test_numbers_and_names_beyond_what_they_are_used_for_are_refused(
    tmp_path: Path, change: dict[str, Any], problem: str
) -> None:
    problems = _problems(tmp_path, _with(change))
    assert len(problems) == 1, problems
    assert problems[0].startswith(problem), problems


def test_a_grid_too_large_to_list_is_refused(tmp_path: Path) -> None:
    change = {
        "searcher.name": "grid",
        "hyperparameters.a": {"type": "int", "minval": 0, "maxval": 9999, "count": 10000},
        "hyperparameters.b": {"type": "double", "minval": 0, "maxval": 1, "count": 10000},
    }
    assert _problems(tmp_path, _with(change)) == [
        "hyperparameters: the grid has 1800000000 points; the grid searcher takes at most "
        "1000000 (lower some counts)"
    ]


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("data:\n  bomb:\n", "data.bomb."),
        (
            "hyperparameters:\n  opt:\n    type: categorical\n    vals:\n",
            "hyperparameters.opt.vals.",
        ),
    ],
)
def test_an_alias_bomb_in_data_or_vals_is_refused_quickly(
    tmp_path: Path, section: str, field: str
) -> None:
    # Billion laughs: nine levels, each listing the one before ten times (10**9 values).
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 9)]
    bomb = section + "".join(f"      - {level}\n" for level in levels)
    config = _with({"hyperparameters.opt": None} if "vals" in field else {})
    if "vals" in field:
        hps = yaml.safe_dump({"hyperparameters": config.pop("hyperparameters")})
        text = yaml.safe_dump(config) + hps + bomb.removeprefix("hyperparameters:\n")
    else:
        text = yaml.safe_dump(config) + bomb
    started = time.monotonic()
    problems = _problems(tmp_path, text)
    assert time.monotonic() - started < 10
    assert len(problems) == 1 and problems[0].startswith(field), problems
    assert "expands to more than 250000 values" in problems[0]


def test_hang_timeout_defaults_to_ten_minutes_and_may_be_disabled(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, _BASE)).hang_timeout_s == 600.0
    assert load_config(_write(tmp_path, _with({"hang_timeout_s": 30}))).hang_timeout_s == 30.0
    text = yaml.safe_dump(_BASE) + "hang_timeout_s: null\n"
    assert load_config(_write(tmp_path, text)).hang_timeout_s is None
    for bad, problem in [
        (0, "hang_timeout_s: Input should be greater than 0 (got 0)"),
        (10**6, "hang_timeout_s: Input should be less than or equal to 604800 (got 1000000)"),
        (float("inf"), "hang_timeout_s: Input should be a finite number (got inf)"),
        ("soon", "hang_timeout_s: Input should be a valid number"),
    ]:
        assert _problems(tmp_path, _with({"hang_timeout_s": bad}))[0].startswith(problem)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        (
            "s3://AKIAEXAMPLE:secret@bucket/ckpt",
            "credentials in the URL are refused: set them in the environment or the "
            "provider config",
        ),
        ("nosuch://bucket/ckpt", "fsspec knows no protocol 'nosuch'"),
    ],
)
def test_a_checkpoint_url_with_credentials_or_an_unknown_protocol_is_refused(
    tmp_path: Path, path: str, problem: str
) -> None:
    [line] = _problems(tmp_path, _with({"checkpoint_storage.path": path}))
    assert line.startswith("checkpoint_storage.path: ") and line.endswith(problem), line
    assert "secret" not in line
    config = load_config(_write(tmp_path, _with({"checkpoint_storage.path": "s3://bucket/ckpt"})))
    assert config.checkpoint_storage.path == "s3://bucket/ckpt"
