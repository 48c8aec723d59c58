"""Samplers, pruners and directions, checked by running real Optuna studies."""

from __future__ import annotations

import itertools
import statistics
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
import pytest

from searcher.submit.samplers import build_pruner, build_sampler, pruner_spec, study_directions
from searcher.submit.space import grid_size, suggest_hparams
from storage import optuna_storage, optuna_trial_id
from trials import pruning
from trials.config import ExperimentConfig, parse_config

_HPARAMS: dict[str, Any] = {
    "global_batch_size": {"type": "categorical", "vals": [32, 64]},
    "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-2, "count": 3},
    "warmup": {"type": "int", "minval": 0, "maxval": 4, "count": 3},
    "scaling": "linear",
}


def _config(hyperparameters: dict[str, Any] | None = None, **searcher: Any) -> ExperimentConfig:
    section: dict[str, Any] = {
        "name": "tpe",
        "metric": "val_loss",
        "max_trials": 20,
        "max_length": {"epochs": 9},
        "seed": 3,
    }
    section.update(searcher)
    return parse_config(
        {
            "name": "test",
            "entrypoint": "model:Trial",
            "hyperparameters": hyperparameters or _HPARAMS,
            "searcher": section,
        }
    )


def _loss(hparams: dict[str, Any]) -> float:
    return (hparams["lr"] - 0.01) ** 2 + hparams["warmup"] + hparams["global_batch_size"] / 64


def _values(config: ExperimentConfig, hparams: dict[str, Any]) -> list[float]:
    # A made-up cost for each cost objective: bigger batches are dearer.
    return [_loss(hparams)] + [float(hparams["global_batch_size"])] * len(
        config.searcher.objectives
    )


def _run(study: optuna.Study, config: ExperimentConfig, n_trials: int) -> list[dict[str, Any]]:
    """Ask/tell ``n_trials`` sequentially, the way the driver does; the hparams asked."""
    asked = []
    for _ in range(n_trials):
        trial = study.ask()
        hparams = suggest_hparams(trial, config.hyperparameters)
        study.tell(trial, _values(config, hparams))
        asked.append(hparams)
    return asked


def _new_study(config: ExperimentConfig, storage: Any = None, name: str | None = None) -> Any:
    return optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=build_sampler(config),
        pruner=build_pruner(config),
        directions=study_directions(config),
    )


@pytest.fixture(autouse=True)
def _quiet_optuna() -> Iterator[None]:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    yield
    optuna.logging.set_verbosity(verbosity)


_SEARCHERS: list[dict[str, Any]] = [
    {"name": "random"},
    {"name": "grid"},
    {"name": "tpe", "n_startup_trials": 3},
    {"name": "cmaes"},
    {"name": "gp", "n_startup_trials": 3},
    {"name": "nsga2", "objectives": ["slot_seconds"]},
]


@pytest.mark.parametrize("searcher", _SEARCHERS, ids=lambda s: s["name"])
def test_a_seeded_search_is_reproducible(searcher: dict[str, Any]) -> None:
    config = _config(**searcher)
    first = _run(_new_study(config), config, 5)
    second = _run(_new_study(config), config, 5)
    assert first == second
    # The search really searches: not one point six times.
    assert len({tuple(sorted(h.items())) for h in first}) > 1


@pytest.mark.parametrize("searcher", _SEARCHERS, ids=lambda s: s["name"])
def test_another_seed_gives_another_search(searcher: dict[str, Any]) -> None:
    first = _run(_new_study(_config(**searcher, seed=1)), _config(**searcher, seed=1), 4)
    second = _run(_new_study(_config(**searcher, seed=2)), _config(**searcher, seed=2), 4)
    assert first != second


def test_grid_covers_every_point_once_with_concurrent_trials_and_a_resume(db_url: str) -> None:
    config = _config(name="grid", max_concurrent_trials=3)
    size = grid_size(config.hyperparameters)
    assert size == 2 * 3 * 3
    storage = optuna_storage(db_url)
    study = _new_study(config, storage, "grid")
    seen = []
    # Three trials running at once, as the driver runs them.
    for _ in range(2):
        trials = [study.ask() for _ in range(3)]
        for trial in trials:
            hparams = suggest_hparams(trial, config.hyperparameters)
            seen.append(hparams)
        for trial, hparams in zip(trials, seen[-3:], strict=True):
            study.tell(trial, _loss(hparams))
    # The driver dies; a new one loads the study with a new sampler and goes on.
    resumed = optuna.load_study(
        study_name="grid",
        storage=storage,
        sampler=build_sampler(config, trials_so_far=len(study.trials)),
    )
    # The last tell must not raise (Optuna's GridSampler calls study.stop() there).
    seen += _run(resumed, config, size - len(seen))
    points = {(h["global_batch_size"], h["lr"], h["warmup"]) for h in seen}
    assert len(seen) == size
    assert points == set(itertools.product([32, 64], [1e-4, 1e-3, 1e-2], [0, 2, 4]))
    assert all(h["scaling"] == "linear" for h in seen)
    assert resumed.sampler.is_exhausted(resumed)  # type: ignore[attr-defined]


def _min_gap_of_concurrent_suggestions(max_concurrent_trials: int, seed: int) -> float:
    config = _config(
        {"global_batch_size": 64, "x": {"type": "double", "minval": 0, "maxval": 1}},
        n_startup_trials=5,
        max_concurrent_trials=max_concurrent_trials,
        seed=seed,
    )
    study = _new_study(config)
    for _ in range(8):
        trial = study.ask()
        study.tell(trial, (suggest_hparams(trial, config.hyperparameters)["x"] - 0.3) ** 2)
    running = [suggest_hparams(study.ask(), config.hyperparameters)["x"] for _ in range(4)]
    return min(abs(a - b) for a, b in itertools.combinations(running, 2))


def test_tpe_gives_concurrent_trials_different_suggestions() -> None:
    # Without the constant liar, four trials asked before any finishes crowd around the
    # best point so far (median gap ~0.004 of the range); with it, running trials count
    # as bad results and the suggestions spread (~0.07).
    seeds = range(10)
    alone = statistics.median(_min_gap_of_concurrent_suggestions(1, s) for s in seeds)
    together = statistics.median(_min_gap_of_concurrent_suggestions(4, s) for s in seeds)
    assert together > 5 * alone


@pytest.mark.parametrize("name", ["random", "tpe", "cmaes", "nsga2"])
def test_resume_continues_the_random_sequence_instead_of_replaying_it(
    name: str, db_url: str
) -> None:
    extra: dict[str, Any] = {"objectives": ["slot_seconds"]} if name == "nsga2" else {}
    # n_startup_trials 10: TPE is still in its random start-up phase when resumed.
    config = _config(
        {
            "global_batch_size": 64,
            "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1},
            "warmup": {"type": "int", "minval": 0, "maxval": 1000},
        },
        name=name,
        n_startup_trials=10,
        **extra,
    )
    storage = optuna_storage(db_url)

    def resume(study_name: str, trials_so_far: int) -> list[dict[str, Any]]:
        study = optuna.load_study(
            study_name=study_name,
            storage=storage,
            sampler=build_sampler(config, trials_so_far=trials_so_far),
        )
        return _run(study, config, 3)

    first = _run(_new_study(config, storage, "a"), config, 3)
    again = resume("a", trials_so_far=3)
    # Nothing proposed after the resume repeats what ran before it.
    assert not {h["warmup"] for h in again} & {h["warmup"] for h in first}
    if name != "nsga2":  # Its replay differs anyway: it also draws from the stored trials.
        # What replaying the seed would do: the same proposals as the first trials.
        _run(_new_study(config, storage, "b"), config, 3)
        assert resume("b", trials_so_far=0) == first
    # And the resume itself is reproducible.
    _run(_new_study(config, storage, "c"), config, 3)
    assert resume("c", trials_so_far=3) == again


def test_cmaes_models_numbers_and_draws_categoricals_at_random() -> None:
    config = _config(name="cmaes", n_startup_trials=2)
    study = _new_study(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # No per-trial independent-sampling warnings.
        _run(study, config, 8)
    cma_trials = [t for t in study.trials if "cma:generation" in t.system_attrs]
    assert len(cma_trials) == 6
    assert {t.params["global_batch_size"] for t in study.trials} == {32, 64}


def test_directions_put_the_metric_first_then_the_costs() -> None:
    assert study_directions(_config(smaller_is_better=False)) == ["maximize"]
    config = _config(name="nsga2", objectives=["slot_seconds", {"name": "wall_seconds"}])
    assert study_directions(config) == ["minimize", "minimize", "minimize"]
    study = _new_study(config)
    _run(study, config, 4)
    assert len(study.best_trials) >= 1  # A Pareto front exists.


def test_nsga2_population_fits_the_search() -> None:
    sampler = build_sampler(_config(name="nsga2", objectives=["slot_seconds"], max_trials=32))
    study = optuna.create_study(sampler=sampler, directions=["minimize", "minimize"])
    for _ in range(12):
        trial = study.ask()
        x = trial.suggest_float("x", 0, 1)
        study.tell(trial, [x, 1 - x])
    generations = {t.system_attrs["NSGAIISampler:generation"] for t in study.trials}
    assert generations == {0, 1}  # population 32 // 4 = 8: trial 9 starts generation 1


def test_pruner_specs_follow_the_config() -> None:
    asha = _config(
        pruner={
            "name": "asha",
            "min_resource": 2,
            "reduction_factor": 4,
            "min_early_stopping_rate": 1,
        }
    )
    spec = pruner_spec(asha)
    assert spec is not None and spec.name == "SuccessiveHalvingPruner"
    assert spec.kwargs == {"min_resource": 2, "reduction_factor": 4, "min_early_stopping_rate": 1}
    band = pruner_spec(
        _config(max_length={"batches": 500}, pruner={"name": "hyperband", "min_resource": 10})
    )
    assert band is not None and band.name == "HyperbandPruner"
    assert band.kwargs == {"min_resource": 10, "max_resource": 500, "reduction_factor": 3}
    median = pruner_spec(_config(pruner={"name": "median", "n_warmup_steps": 2}))
    assert median is not None and median.name == "MedianPruner"
    # Optuna's steps count from 0, the runtime's from 1 (completed epochs).
    assert median.kwargs == {"n_startup_trials": 5, "n_warmup_steps": 3}
    assert pruner_spec(_config()) is None
    assert isinstance(build_pruner(_config()), optuna.pruners.NopPruner)
    for config, cls in [
        (asha, optuna.pruners.SuccessiveHalvingPruner),
        (_config(pruner={"name": "hyperband"}), optuna.pruners.HyperbandPruner),
        (_config(pruner={"name": "median"}), optuna.pruners.MedianPruner),
    ]:
        assert isinstance(build_pruner(config), cls)


@pytest.mark.parametrize(
    ("pruner", "name", "cls"),
    [
        (
            {"name": "asha", "min_resource": 2},
            "ParetoSuccessiveHalvingPruner",
            pruning.ParetoSuccessiveHalvingPruner,
        ),
        ({"name": "hyperband"}, "ParetoHyperbandPruner", pruning.ParetoHyperbandPruner),
    ],
)
def test_a_multi_objective_search_prunes_by_pareto_fronts(
    pruner: dict[str, Any], name: str, cls: type
) -> None:
    single = pruner_spec(_config(pruner=pruner))
    config = _config(name="nsga2", objectives=["slot_seconds"], pruner=pruner)
    spec = pruner_spec(config)
    # The same rungs; each ranked over the metric and the compute spent at the rung.
    assert spec is not None and single is not None
    assert (spec.name, spec.kwargs) == (name, single.kwargs)
    assert isinstance(build_pruner(config), cls)
    assert study_directions(config) == ["minimize", "minimize"]


def _prunes_bad_trial(config: ExperimentConfig, n_good: int) -> list[bool]:
    """Run ``n_good`` good trials to the end, then ask about a bad one at each step."""
    # Hyperband picks a trial's bracket from a hash of the study name: a fixed name makes
    # the decisions the same in every run (a random one left the bad trial unpruned at times).
    study = optuna.create_study(
        study_name="prunes-bad-trial",
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=build_pruner(config),
        direction=study_directions(config)[0],
    )
    # Steps are completed epochs, from 1, as the runtime reports them.
    steps = range(1, config.searcher.max_length.value + 1)
    for i in range(n_good):
        trial = study.ask()
        for step in steps:
            trial.report(1.0 / step + 0.01 * i, step)
            # The runtime asks after every report; the pruner records rungs when asked.
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, 1.0 / config.searcher.max_length.value + 0.01 * i)
    bad = study.ask()
    decisions = []
    for step in steps:
        bad.report(10.0, step)
        decisions.append(bad.should_prune())
    return decisions


@pytest.mark.parametrize(
    ("pruner", "first_pruned_step"),
    [
        ({"name": "asha", "min_resource": 1, "reduction_factor": 3}, 1),
        ({"name": "asha", "min_resource": 3, "reduction_factor": 3}, 3),
        ({"name": "asha", "min_resource": 1, "min_early_stopping_rate": 1}, 3),
        # Two warm-up epochs are never pruned: the first chance is after the third.
        ({"name": "median", "n_startup_trials": 3, "n_warmup_steps": 2}, 3),
        ({"name": "median", "n_startup_trials": 3}, 1),
    ],
)
def test_pruners_stop_a_clearly_bad_trial_where_the_config_says(
    pruner: dict[str, Any], first_pruned_step: int
) -> None:
    config = _config(pruner=pruner)
    decisions = _prunes_bad_trial(config, n_good=6)
    assert decisions.index(True) + 1 == first_pruned_step


def test_hyperband_prunes_a_clearly_bad_trial() -> None:
    config = _config(pruner={"name": "hyperband", "min_resource": 1, "reduction_factor": 3})
    decisions = _prunes_bad_trial(config, n_good=12)
    assert any(decisions)
    # max_resource is max_length: no bracket asks about a step beyond it.
    assert decisions.index(True) + 1 <= config.searcher.max_length.value


def test_pruner_spec_rebuilds_the_same_decisions_in_another_study_object(db_url: str) -> None:
    # Rank 0 of a trial rebuilds the pruner from the spec and loads the study itself.
    config = _config(pruner={"name": "asha", "min_resource": 1})
    storage = optuna_storage(db_url)
    study = _new_study(config, storage, "pruned")
    for i in range(4):
        trial = study.ask()
        for step in (1, 2, 3):
            trial.report(float(i), step)
            trial.should_prune()
        study.tell(trial, float(i))
    bad = study.ask()
    bad.report(99.0, 1)
    spec = pruner_spec(config)
    assert spec is not None
    in_rank = optuna.load_study(
        study_name="pruned", storage=storage, pruner=pruning.build_pruner(spec)
    )
    rank_trial = optuna.trial.Trial(in_rank, optuna_trial_id(db_url, "pruned", bad.number))
    assert rank_trial.should_prune()
