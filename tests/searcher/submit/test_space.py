"""The search space: suggestions, grid points and enqueued values agree with the config."""

from __future__ import annotations

import math
import warnings

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from searcher.submit.space import (
    distributions,
    grid_search_space,
    grid_size,
    parse_enqueue_params,
    suggest_hparams,
)
from trials.config import (
    CategoricalHP,
    ConfigError,
    ConstHP,
    DoubleHP,
    Hyperparameter,
    IntHP,
    LogHP,
)

HPS: dict[str, Hyperparameter] = {
    "global_batch_size": CategoricalHP(type="categorical", vals=[32, 64, 128]),
    "lr": LogHP(type="log", minval=1e-4, maxval=1e-1),
    "dropout": DoubleHP(type="double", minval=0.0, maxval=0.5),
    "warmup": IntHP(type="int", minval=0, maxval=5),
    "layers": CategoricalHP(type="categorical", vals=[[64], [64, 32], None]),
    "optimizer": CategoricalHP(type="categorical", vals=["sgd", "adamw"]),
    "lr_scaling": ConstHP(type="const", val="linear"),
    "schedule": ConstHP(type="const", val={"milestones": [2, 4]}),
}


def _int(minval: int, maxval: int, count: int | None = None) -> IntHP:
    return IntHP(type="int", minval=minval, maxval=maxval, count=count)


def test_every_hyperparameter_is_in_the_hparams_with_its_type() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        hparams = suggest_hparams(trial, HPS)
        assert list(hparams) == list(HPS)
        assert hparams["global_batch_size"] in (32, 64, 128)
        assert 1e-4 <= hparams["lr"] <= 1e-1
        assert 0.0 <= hparams["dropout"] <= 0.5
        assert hparams["warmup"] in range(6)
        assert hparams["layers"] in ([64], [64, 32], None)
        assert hparams["optimizer"] in ("sgd", "adamw")
        assert hparams["lr_scaling"] == "linear"
        assert hparams["schedule"] == {"milestones": [2, 4]}
        # Constants are not Optuna parameters; the list choice is stored as JSON text.
        assert set(trial.params) == set(HPS) - {"lr_scaling", "schedule"}
        assert trial.params["layers"] in ("[64]", "[64, 32]", "null")
        study.tell(trial, hparams["lr"])


def test_the_log_range_is_sampled_on_a_log_scale() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    lrs = [suggest_hparams(study.ask(), {"lr": HPS["lr"]})["lr"] for _ in range(400)]
    below_1e3 = sum(lr < 1e-3 for lr in lrs) / len(lrs)
    assert 0.25 < below_1e3 < 0.42  # a third of the decades; uniform would give ~1%


def test_constants_are_copies_a_trial_cannot_change_the_config() -> None:
    hparams = suggest_hparams(optuna.trial.FixedTrial({}), {"schedule": HPS["schedule"]})
    hparams["schedule"]["milestones"].append(6)
    assert HPS["schedule"].val == {"milestones": [2, 4]}  # type: ignore[union-attr]


def test_a_stored_trial_rebuilds_its_hparams() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    hparams = suggest_hparams(trial, HPS)
    study.tell(trial, 0.0)
    stored = study.trials[0].params
    assert suggest_hparams(optuna.trial.FixedTrial(stored), HPS) == hparams


@pytest.mark.parametrize(
    ("hp", "expected"),
    [
        (_int(0, 5), IntDistribution(0, 5)),
        (_int(0, 10, count=3), IntDistribution(0, 10, step=5)),
        (_int(0, 10, count=11), IntDistribution(0, 10)),
        (_int(0, 10, count=50), IntDistribution(0, 10)),
        (_int(1, 8, count=4), CategoricalDistribution([1, 3, 6, 8])),
        (_int(0, 10, count=1), IntDistribution(5, 5)),
        (_int(3, 3), IntDistribution(3, 3)),
        (DoubleHP(type="double", minval=-1, maxval=1, count=4), FloatDistribution(-1, 1)),
        (LogHP(type="log", minval=1e-3, maxval=1), FloatDistribution(1e-3, 1, log=True)),
        (
            CategoricalHP(type="categorical", vals=[1, "a", None]),
            CategoricalDistribution([1, "a", None]),
        ),
        (
            CategoricalHP(type="categorical", vals=[{"a": 1}, "[1]"]),
            CategoricalDistribution(['{"a": 1}', '"[1]"']),
        ),
    ],
)
def test_distributions(
    hp: Hyperparameter, expected: optuna.distributions.BaseDistribution
) -> None:
    assert distributions({"x": hp}) == {"x": expected}


def test_constants_have_no_distribution() -> None:
    assert distributions({"c": ConstHP(type="const", val=3)}) == {}


def test_an_int_count_restricts_every_searcher_not_only_grid() -> None:
    hps = {"n": _int(1, 8, count=4), "m": _int(0, 100, count=5)}
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    for _ in range(15):
        trial = study.ask()
        hparams = suggest_hparams(trial, hps)
        assert hparams["n"] in (1, 3, 6, 8)
        assert hparams["m"] in (0, 25, 50, 75, 100)
        study.tell(trial, hparams["n"] + hparams["m"])


def test_grid_points() -> None:
    hps: dict[str, Hyperparameter] = {
        "lr": LogHP(type="log", minval=1e-4, maxval=1e-1, count=4),
        "dropout": DoubleHP(type="double", minval=0, maxval=0.3, count=4),
        "mid": DoubleHP(type="double", minval=0, maxval=1, count=1),
        "warmup": _int(0, 5, count=3),
        "n": _int(0, 2, count=10),
        "layers": CategoricalHP(type="categorical", vals=[[64], [64, 32]]),
        "scaling": ConstHP(type="const", val="linear"),
    }
    grid = grid_search_space(hps)
    assert grid["lr"] == [1e-4, 1e-3, 1e-2, 1e-1]
    assert grid["dropout"] == [0.0, 0.1, 0.2, 0.3]
    assert grid["mid"] == [0.5]
    assert grid["warmup"] == [0, 3, 5]  # 0, 2.5, 5 rounded half up
    assert grid["n"] == [0, 1, 2]  # count beyond the range: every integer
    assert grid["layers"] == ["[64]", "[64, 32]"]
    assert "scaling" not in grid
    assert grid_size(hps) == 4 * 4 * 1 * 3 * 3 * 2


def test_grid_needs_a_count_for_each_numeric_range() -> None:
    hps: dict[str, Hyperparameter] = {
        "lr": LogHP(type="log", minval=1e-4, maxval=1e-1),
        "warmup": _int(0, 5),
        "opt": CategoricalHP(type="categorical", vals=["sgd"]),
    }
    with pytest.raises(ConfigError) as info:
        grid_search_space(hps)
    assert info.value.problems == [
        "hyperparameters.lr.count: required by the grid searcher (how many points between minval and maxval)",
        "hyperparameters.warmup.count: required by the grid searcher (how many points between minval and maxval)",
    ]


def test_enqueued_values_are_parsed_into_optunas_representation() -> None:
    params = parse_enqueue_params(
        HPS,
        [
            "lr=1e-3",
            "dropout=0",
            "warmup=2",
            "layers=[64, 32]",
            "optimizer=adamw",
            "global_batch_size=64",
        ],
    )
    assert params == {
        "lr": 1e-3,
        "dropout": 0.0,
        "warmup": 2,
        "layers": "[64, 32]",
        "optimizer": "adamw",
        "global_batch_size": 64,
    }
    assert parse_enqueue_params(HPS, ["layers=null"]) == {"layers": "null"}
    assert parse_enqueue_params(HPS, ["warmup=3.0"]) == {"warmup": 3}
    strings = {"v": CategoricalHP(type="categorical", vals=["1", "yes", "1e-3"])}
    # Strings that YAML would read as numbers or booleans still match.
    assert parse_enqueue_params(strings, ["v=1"]) == {"v": "1"}
    assert parse_enqueue_params(strings, ["v=yes"]) == {"v": "yes"}
    flags = {"b": CategoricalHP(type="categorical", vals=[True, 1])}
    assert parse_enqueue_params(flags, ["b=true"]) == {"b": True}
    assert parse_enqueue_params(flags, ["b=1"]) == {"b": 1}


def test_an_enqueued_trial_runs_with_exactly_those_values() -> None:
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial(parse_enqueue_params(HPS, ["lr=0.01", "layers=[64]", "warmup=4"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns about fixed values outside the space.
        hparams = suggest_hparams(study.ask(), HPS)
    assert (hparams["lr"], hparams["layers"], hparams["warmup"]) == (0.01, [64], 4)


def test_grid_enqueue_needs_every_searched_value() -> None:
    hps: dict[str, Hyperparameter] = {
        "warmup": _int(0, 4, count=3),
        "opt": CategoricalHP(type="categorical", vals=["sgd", "adamw"]),
        "scaling": ConstHP(type="const", val="linear"),
    }
    with pytest.raises(ValueError) as info:
        parse_enqueue_params(hps, ["warmup=2"], require_all=True)
    assert str(info.value) == (
        "opt: missing; the grid searcher needs a value for every searched hyperparameter"
    )
    params = parse_enqueue_params(hps, ["warmup=2", "opt=sgd"], require_all=True)
    sampler = optuna.samplers.GridSampler(grid_search_space(hps), seed=0)
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial(params)
    assert suggest_hparams(study.ask(), hps) == {"warmup": 2, "opt": "sgd", "scaling": "linear"}


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["lr"], "'lr': expected key=value, e.g. global_batch_size=..."),
        (["=3"], "'=3': expected key=value, e.g. global_batch_size=..."),
        (
            ["momentum=0.9"],
            "momentum: unknown hyperparameter; allowed: global_batch_size, lr, dropout, "
            "warmup, layers, optimizer",
        ),
        (
            ["lr_scaling=sqrt"],
            "lr_scaling: is a constant ('linear') in the experiment's config and cannot be "
            "enqueued; allowed: global_batch_size, lr, dropout, warmup, layers, optimizer",
        ),
        (["lr=0.01", "lr=0.02"], "lr: given more than once"),
        (["lr=1"], "lr: must be a number in [0.0001, 0.1] (log scale), got '1'"),
        (["lr=fast"], "lr: must be a number in [0.0001, 0.1] (log scale), got 'fast'"),
        (["lr=nan"], "lr: must be a number in [0.0001, 0.1] (log scale), got 'nan'"),
        (["dropout=true"], "dropout: must be a number in [0.0, 0.5], got 'true'"),
        (["warmup=2.5"], "warmup: must be an integer in [0, 5], got '2.5'"),
        (["warmup=9"], "warmup: must be an integer in [0, 5], got '9'"),
        (["optimizer=adam"], "optimizer: must be one of sgd, adamw, got 'adam'"),
        (["layers=[32]"], "layers: must be one of [64], [64, 32], null, got '[32]'"),
        (["global_batch_size=48"], "global_batch_size: must be one of 32, 64, 128, got '48'"),
        (
            [],
            "enqueue: give at least one key=value; keys: global_batch_size, lr, dropout, "
            "warmup, layers, optimizer",
        ),
    ],
)
def test_bad_enqueue_values_name_the_key_and_what_is_allowed(
    words: list[str], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        parse_enqueue_params(HPS, words)
    assert str(info.value) == message


def test_enqueue_messages_for_restricted_int_ranges() -> None:
    hps: dict[str, Hyperparameter] = {"a": _int(0, 10, count=3), "b": _int(1, 8, count=4)}
    with pytest.raises(
        ValueError, match=r"^a: must be an integer in \[0, 10\] in steps of 5, got '3'$"
    ):
        parse_enqueue_params(hps, ["a=3"])
    with pytest.raises(ValueError, match=r"^b: must be one of 1, 3, 6, 8, got '2'$"):
        parse_enqueue_params(hps, ["b=2"])
    assert parse_enqueue_params(hps, ["a=10", "b=6"]) == {"a": 10, "b": 6}


# Property tests: any hyperparameter the config accepts works with Optuna as declared.
_finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
_json_scalars = (
    st.none() | st.booleans() | st.integers(-1000, 1000) | _finite | st.text(max_size=5)
)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def _hyperparameter(draw: st.DrawFn) -> Hyperparameter:
    kind = draw(st.sampled_from(["const", "int", "double", "log", "categorical"]))
    count = draw(st.none() | st.integers(1, 12))
    if kind == "const":
        return ConstHP(type="const", val=draw(_json))
    if kind == "int":
        low = draw(st.integers(-1000, 1000))
        return _int(low, low + draw(st.integers(0, 1000)), count)
    if kind == "double":
        low = draw(_finite)
        high = draw(st.floats(min_value=low, max_value=2e6).filter(lambda h: h > low))
        return DoubleHP(type="double", minval=low, maxval=high, count=count)
    if kind == "log":
        low = draw(st.floats(min_value=1e-12, max_value=1e3))
        high = low * draw(st.floats(min_value=1.0001, max_value=1e9))
        return LogHP(type="log", minval=low, maxval=high, count=count)
    vals = draw(st.lists(_json, min_size=1, max_size=5, unique_by=lambda v: repr(v)))
    try:
        return CategoricalHP(type="categorical", vals=vals)
    except ValueError:  # Equal as JSON (1 and 1.0 are not, [1] and [1] are): invalid.
        return CategoricalHP(type="categorical", vals=vals[:1])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hps=st.dictionaries(st.sampled_from("abcde"), _hyperparameter(), min_size=1, max_size=4))
def test_any_accepted_space_can_be_sampled_and_gridded(hps: dict[str, Hyperparameter]) -> None:
    dists = distributions(hps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns when a value lies outside the space.
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for _ in range(3):
            trial = study.ask()
            hparams = suggest_hparams(trial, hps)
            assert list(hparams) == list(hps)
            for name, value in trial.params.items():
                internal = dists[name].to_internal_repr(value)
                assert dists[name]._contains(internal)
            # A stored trial gives back the same hparams.
            assert suggest_hparams(optuna.trial.FixedTrial(trial.params), hps) == hparams
        if all(getattr(hp, "count", 1) is not None for hp in hps.values()):
            grid = grid_search_space(hps)
            assert grid_size(hps) == math.prod(len(points) for points in grid.values())
            for name, points in grid.items():
                assert len(points) == len(set(map(repr, points)))  # no repeats
                for point in points:
                    assert dists[name]._contains(dists[name].to_internal_repr(point))
