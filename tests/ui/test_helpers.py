"""The UI's small pure helpers: log tails, checkpoint downloads, cluster layout, plots, launch."""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._demo_data import DemoSearch
from ui import _checkpoints, _cluster, _logs, _plots


def test_tail_reads_only_the_end_and_filters_ranks(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    lines = ["torchrun: starting"] + [f"[rank {i % 2}] line {i}" for i in range(10_000)]
    log.write_text("\n".join(lines) + "\n")
    tail = _logs.tail_lines(log, 5, max_bytes=200)
    assert tail == lines[-5:]
    # A seek that lands mid-line drops the partial first line instead of showing it.
    assert all(line in lines for line in _logs.tail_lines(log, 1000, max_bytes=200))
    assert _logs.ranks_in(tail) == [0, 1]
    assert _logs.filter_rank(tail, 1) == [line for line in tail if line.startswith("[rank 1] ")]
    assert _logs.filter_rank(tail, None) == tail
    assert _logs.parse_rank("[rank 12] x") == 12
    assert _logs.parse_rank("rank 1 x") is None


def test_checkpoint_download_round_trips_through_torch_load(synthetic_search: DemoSearch) -> None:
    import torch

    # The runtime's layout: a folder holding state.pt and metadata.json, zipped for download.
    path = synthetic_search.downloadable_checkpoint_path
    assert _checkpoints.checkpoint_problem(path, "COMPLETED") is None
    archive = zipfile.ZipFile(io.BytesIO(_checkpoints.checkpoint_bytes(path)))
    assert sorted(archive.namelist()) == ["metadata.json", "state.pt"]
    state = torch.load(io.BytesIO(archive.read("state.pt")), weights_only=True)
    assert state["kind"] == "core" and state["steps_completed"] > 0
    assert set(state["user_state"]) >= {"model", "optimizer", "lr_scheduler"}
    # Named after the experiment, trial and step, never the bare UUID folder name.
    assert _checkpoints.download_name(path, "regression demo", 3, 40) == (
        "regression-demo-3-step40.zip"
    )
    assert Path(path).name not in _checkpoints.download_name(path, "regression demo", 3, 40)


def test_checkpoint_problems_are_named(synthetic_search: DemoSearch, tmp_path: Path) -> None:
    missing = synthetic_search.missing_checkpoint_path
    assert _checkpoints.checkpoint_problem(missing, "COMPLETED") == (
        f"The checkpoint file is missing on disk: {missing}"
    )
    assert "deleted by the retention policy" in str(
        _checkpoints.checkpoint_problem(missing, "DELETED")
    )


def test_checkpoint_directory_downloads_as_zip(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights")
    (folder / "sub" / "meta.json").write_text("{}")
    archive = zipfile.ZipFile(io.BytesIO(_checkpoints.checkpoint_bytes(str(folder))))
    assert sorted(archive.namelist()) == ["model.pt", "sub/meta.json"]
    assert archive.read("model.pt") == b"weights"
    assert _checkpoints.download_name(str(folder), "exp", 0, 7) == "exp-0-step7.zip"


def test_cluster_layout_from_the_scheduler_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests._demo_data import write_cluster_file

    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(write_cluster_file(tmp_path / "c.yaml")))
    layout, why_not = _cluster.load_layout()
    assert why_not is None and layout is not None
    assert layout[0] == _cluster.AgentLayout("default", "agent-0", "127.0.0.1", (0, 1, 2, 3))
    assert len(layout) == 9
    counted = SimpleNamespace(
        pools=[SimpleNamespace(name="p", agents=[SimpleNamespace(name="a", host="h", slots=2)])]
    )
    assert _cluster.cluster_layout(counted)[0].slots == (0, 1)


def test_bad_cluster_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("resource_pools: 3\n")
    monkeypatch.setenv("SLOTSWEEP_CLUSTER", str(bad))
    layout, why_not = _cluster.load_layout()
    assert layout is None
    assert why_not is not None and why_not.startswith("Could not load the cluster layout")


def test_plot_guards_say_why(synthetic_search: DemoSearch) -> None:
    import optuna

    empty = optuna.create_study()
    for kind in _plots.SINGLE_OBJECTIVE_PLOTS:
        figure, reason = _plots.make_plot(empty, kind, ["val_loss"])
        assert figure is None and reason
    figure, reason = _plots.make_plot(empty, _plots.PARETO, ["val_loss"])
    assert figure is None and reason == "The Pareto front needs a multi-objective study."
    study = _plots.snapshot_study(synthetic_search.url, synthetic_search.study_name)
    # The driver names no metrics in Optuna: the config's metric names the objective.
    assert study.metric_names is None
    assert _plots.objective_names(study, "val_loss") == ["val_loss"]
    named = optuna.create_study()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        named.set_metric_names(["accuracy"])
    assert _plots.objective_names(named, "ignored") == ["accuracy"]
    complete = len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    assert complete < _plots.MIN_TRIALS_FOR_IMPORTANCES
    for kind in _plots.available_plots(1):
        figure, reason = _plots.make_plot(study, kind, ["val_loss"])
        if kind == _plots.IMPORTANCES:
            assert figure is None
            assert reason == (
                "Parameter importances need at least 5 completed trials to mean anything; "
                f"this study has {complete}."
            )
        else:
            assert figure is not None, (kind, reason)
    with pytest.raises(ValueError, match="kind: must be one of"):
        _plots.make_plot(study, "Waterfall", ["val_loss"])


def test_importances_from_five_trials_say_what_they_rest_on() -> None:
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_int("n", 0, 3), n_trials=5)
    figure, reason = _plots.make_plot(study, _plots.IMPORTANCES, ["val_loss"])
    assert figure is not None and reason is None
    assert _plots.plot_caption(study, _plots.IMPORTANCES).startswith(
        "Importances (fANOVA) rest on 5 completed trials"
    )


def test_plots_use_colour_scales_readable_on_white() -> None:
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_float("y", 0, 1), n_trials=8)
    parallel, _ = _plots.make_plot(study, _plots.PARALLEL, ["val_loss"])
    contour, _ = _plots.make_plot(study, _plots.CONTOUR, ["val_loss"], ["x", "y"])
    assert parallel is not None and contour is not None
    from plotly.colors import hex_to_rgb, unlabel_rgb

    scales = [t.colorscale for t in contour.data if t.type == "contour"]
    scales += [t.marker.colorscale for t in parallel.data if t.marker.colorscale is not None]
    assert len(scales) == 2 and all(
        [list(step) for step in scale] == _plots.CONTRAST_SAFE_SCALE for scale in scales
    )
    # Every trial's line, the worst included, and every colour of the scale is darker
    # than mid grey on some channel: none is near-white on the white page.
    lines = [t.line.color for t in parallel.data if isinstance(t.line.color, str)]
    assert len(lines) == 8
    channels = [unlabel_rgb(c) for c in lines]
    channels += [hex_to_rgb(c) for _, c in _plots.CONTRAST_SAFE_SCALE]
    assert all(min(rgb) < 128 for rgb in channels), channels


def test_actions_refuse_finished_experiments_and_unknown_actions(
    writable_synthetic: DemoSearch,
) -> None:
    from ui import _actions

    url = writable_synthetic.url
    finished = writable_synthetic.multi_objective_experiment_id
    assert _actions.request_action(url, finished, "kill") == (
        f"Experiment {finished} is already COMPLETED; nothing to do."
    )
    assert _actions.request_action(url, 9999, "pause") == "Experiment 9999 does not exist."
    with pytest.raises(ValueError, match="action: must be one of pause, kill"):
        _actions.request_action(url, writable_synthetic.experiment_id, "delete")
