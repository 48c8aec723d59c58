"""The Diagnosis page and the Trial page's "diagnose this configuration" command."""

from __future__ import annotations

from pathlib import Path

import pytest

from searcher.diagnose.diagnosis import Exchange, Probe, Spread, Window
from searcher.diagnose.probes import build_report
from storage import Diagnosis, session_scope
from tests._demo_data import DemoSearch
from tests.searcher.conftest import write_experiment
from tests.ui._pages import PageRenderer, assert_no_exception, texts
from trials.config import load_config
from ui._diagnosis import diagnose_command, probe_table, step_split_frame


def _probe(name: str, step_s: float, input_s: float = 0.0) -> Probe:
    windows = tuple(Window(10, input_s * 10, (step_s - input_s) * 10 * f, 0.0) for f in (0.9, 1.1))
    return Probe(name, name, 2, 64, windows, {"cpu_util_percent": 90.0})


def _store(url: str, tmp_path: Path) -> int:
    config = load_config(write_experiment(tmp_path / "exp"))
    sweep = {1.0: Spread(0.002, 0.002, 0.003), 64.0: Spread(0.004, 0.004, 0.005)}
    report = build_report(
        config,
        [
            _probe("configured", 0.04, 0.002),
            _probe("synthetic", 0.038),
            _probe("no_exchange", 0.01, 0.002),
        ],
        Exchange(4810, 19240, 2, 64.0, sweep),
    )
    with session_scope(url) as session:
        row = Diagnosis(
            name=config.name,
            config_path="/m/experiment.yaml",
            verdict=report.verdict.value,
            report=report.as_json(),
        )
        session.add(row)
        session.flush()
        return int(row.id)


def test_the_command_names_searched_values_and_hides_the_password() -> None:
    command = diagnose_command(
        "/my models/experiment.yaml",
        {"lr": 0.01, "optimizer": "sgd", "hidden_size": 64, "sizes": [64, 32]},
        ["lr", "optimizer", "sizes"],
        "postgresql://me:secret@db/sweeps",
    )
    assert command == (
        "slotsweep diagnose '/my models/experiment.yaml' --hparams lr=0.01 optimizer=sgd "
        "'sizes=[64, 32]' --db 'postgresql://me:***@db/sweeps'"
    )
    assert diagnose_command(None, {}, [], None) == "slotsweep diagnose CONFIG"


def test_the_diagnosis_page_shows_probes_verdict_and_the_step_split(
    render: PageRenderer, db_url: str, tmp_path: Path
) -> None:
    empty = render("diagnosis", db_url)
    assert_no_exception(empty)
    assert "No diagnosis yet" in texts(empty)
    diagnosis_id = _store(db_url, tmp_path)
    app = render("diagnosis", db_url, diagnosis=diagnosis_id)
    assert_no_exception(app)
    shown = texts(app)
    assert "communication-bound" in shown
    assert "Communication share: 75% " in shown
    assert "optimizations.aggregation_frequency" in shown and "measured 4x" in shown
    probes = app.dataframe[0].value
    assert list(probes["probe"]) == ["configured", "synthetic", "no_exchange"]
    assert list(app.dataframe[1].value["bucket_mb"]) == [1.0, 64.0]
    (chart,) = app.get("vega_lite_chart")
    assert '"stack": "zero"' in chart.proto.spec  # type: ignore[attr-defined]


def test_report_tables_read_the_stored_document(db_url: str, tmp_path: Path) -> None:
    diagnosis_id = _store(db_url, tmp_path)
    with session_scope(db_url) as session:
        row = session.get(Diagnosis, diagnosis_id)
        assert row is not None
        report = row.report
    table = probe_table(report)
    assert table.loc[0, "step_ms"] == pytest.approx(40.0)
    assert table.loc[0, "cpu_util_percent"] == 90.0
    split = step_split_frame(report).set_index("part")["ms"]
    assert split.sum() == pytest.approx(40.0)
    assert (split["input"], split["communication"]) == pytest.approx((2.0, 30.0))


def test_the_trial_page_shows_the_diagnose_command(
    render: PageRenderer, synthetic_search: DemoSearch
) -> None:
    app = render("trial", synthetic_search.url)
    assert_no_exception(app)
    (command,) = [c.value for c in app.code if str(c.value).startswith("slotsweep diagnose ")]
    assert "--hparams " in command and f"--db {synthetic_search.url}" in command
