"""The UI's small pure helpers: log tails, checkpoint downloads, cluster layout, plots, launch."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from ui import APP_PATH, _checkpoints, _cluster, _logs, _plots, streamlit_command
from ui._demo_data import DemoSearch


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

    path = synthetic_search.downloadable_checkpoint_path
    assert _checkpoints.checkpoint_problem(path, "COMPLETED") is None
    state = torch.load(io.BytesIO(_checkpoints.checkpoint_bytes(path)), weights_only=True)
    assert set(state) >= {"model", "optimizer", "lr_scheduler", "step"}
    assert _checkpoints.download_name(path) == Path(path).name


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
    assert _checkpoints.download_name(str(folder)) == "ckpt.zip"


def test_cluster_layout_from_the_scheduler_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ui._demo_data import write_cluster_file

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
    assert _plots.objective_names(study, "ignored") == ["val_loss"]
    for kind in _plots.available_plots(1):
        figure, reason = _plots.make_plot(study, kind, ["val_loss"])
        assert figure is not None, (kind, reason)
    with pytest.raises(ValueError, match="kind: must be one of"):
        _plots.make_plot(study, "Contour", ["val_loss"])


def test_streamlit_command_runs_the_app_without_a_shell() -> None:
    command = streamlit_command("sqlite:////tmp/x.db", host="127.0.0.1", port=8600)
    assert command == [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.address",
        "127.0.0.1",
        "--server.port",
        "8600",
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--",
        "--db",
        "sqlite:////tmp/x.db",
    ]
    assert APP_PATH.is_file()


def test_app_reads_the_database_from_its_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    from ui import _context

    monkeypatch.setenv("SLOTSWEEP_DB", "sqlite:///from-env.db")
    assert _context.db_url(["--db", "sqlite:///from-argv.db"]) == "sqlite:///from-argv.db"
    assert _context.db_url(["--unrelated", "x"]) == "sqlite:///from-env.db"


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
