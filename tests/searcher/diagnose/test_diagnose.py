"""``slotsweep diagnose``: the verdict from numbers (pure, microseconds), the probe plan,
and real probes of the digits example with a bottleneck put in on purpose."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest
import sqlalchemy as sa
from rich.console import Console
from sqlalchemy import select

from searcher.cli import main
from searcher.diagnose.diagnosis import (
    BOUND_SHARE,
    Exchange,
    Probe,
    Spread,
    Suggestion,
    Verdict,
    Window,
    efficiency,
    judge,
    share_removed,
    step_split,
    suggest,
)
from searcher.diagnose.probes import (
    MIN_PROBE_BATCHES,
    OPTIONAL_PROBES,
    build_report,
    point_of,
    print_report,
    probe_database,
    probe_plan,
)
from searcher.experiments import UsageError
from searcher.submit.submission import open_database
from storage import Diagnosis, get_engine, session_scope, upgrade_schema
from tests.searcher.conftest import write_experiment
from trials.config import load_config
from trials.executors import LocalExecutor, SlurmExecutor

HERE = Path(__file__).resolve().parent


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


@pytest.fixture
def children_before() -> set[int]:
    """This process's children before the test: a session's servers that earlier tests on
    this worker started (an S3 server, say) are not the test's to end."""
    return _children()


def probe(name: str, step_s: float, *, slots: int = 2, input_s: float = 0.0) -> Probe:
    windows = tuple(
        Window(10, input_s * 10, (step_s - input_s) * 10 * f, 0.0) for f in (0.9, 1.0, 1.1)
    )
    return Probe(name, name, slots, 32 * slots, windows)


# -- pure: microseconds --------------------------------------------------------------


def test_the_verdict_names_the_larger_share_past_the_bound() -> None:
    assert judge(communication_share=0.5, input_share=0.3, efficiency=0.4) is (
        Verdict.COMMUNICATION_BOUND
    )
    assert judge(communication_share=0.3, input_share=0.5, efficiency=0.4) is Verdict.INPUT_BOUND
    assert judge(communication_share=0.1, input_share=0.1, efficiency=0.9) is Verdict.SCALING_WELL
    assert judge(communication_share=0.1, input_share=0.1, efficiency=0.5) is (
        Verdict.COMPUTE_BOUND
    )
    assert judge(communication_share=0.0, input_share=0.0, efficiency=None) is (
        Verdict.SCALING_WELL
    )


def test_shares_and_efficiency_carry_the_spread_of_the_windows() -> None:
    share = share_removed(Spread(1.0, 0.8, 1.2), Spread(0.5, 0.4, 0.6))
    assert (share.median, share.low, share.high) == pytest.approx((0.5, 0.25, 2 / 3))
    assert share_removed(Spread(1.0, 1.0, 1.0), Spread(2.0, 2.0, 2.0)).median == 0.0
    assert efficiency(Spread(150.0, 150.0, 150.0), 2, Spread(100.0, 100.0, 100.0)).median == 0.75
    assert efficiency(Spread(200.0, 200.0, 200.0), 4, Spread(100.0, 100.0, 100.0), 2).median == 1.0


def test_suggestions_carry_the_gain_their_probe_measured() -> None:
    configured = probe("configured", 0.04)
    no_exchange, synthetic = probe("no_exchange", 0.01), probe("synthetic", 0.04)
    sweep = {1.0: Spread(0.002, 0.002, 0.002), 64.0: Spread(0.004, 0.004, 0.004)}
    exchange = Exchange(1000, 4000, 2, 64.0, sweep)
    tips = suggest(
        Verdict.COMMUNICATION_BOUND,
        configured=configured,
        no_exchange=no_exchange,
        synthetic=synthetic,
        exchange=exchange,
        aggregation_frequency=1,
        compression="none",
    )
    gains = {tip.setting.split(":")[0]: tip.gain for tip in tips}
    assert gains["optimizations.aggregation_frequency"] == pytest.approx(4.0)
    assert gains["optimizations.gradient_compression"] is None  # its probe did not run
    assert gains["optimizations.tensor_fusion_threshold"] == pytest.approx(2.0)
    assert exchange.best_bucket_mb == 1.0 and exchange.bandwidth_bytes_s == 2_000_000
    slow_input = probe("configured", 0.04, input_s=0.03)
    (tip,) = suggest(
        Verdict.INPUT_BOUND,
        configured=slow_input,
        no_exchange=None,
        synthetic=probe("synthetic", 0.01),
        exchange=None,
        aggregation_frequency=1,
        compression="none",
    )
    assert "num_workers" in tip.setting and tip.gain == pytest.approx(4.0)


def test_compression_carries_the_gain_its_probe_measured_faster_or_not() -> None:
    def compression_tips(compression: str, compressed_step_s: float) -> list[Suggestion]:
        tips = suggest(
            Verdict.COMMUNICATION_BOUND,
            configured=probe("configured", 0.04),
            no_exchange=probe("no_exchange", 0.01),
            synthetic=None,
            exchange=None,
            aggregation_frequency=1,
            compression=compression,
            compressed=probe("compression", compressed_step_s),
        )
        return [tip for tip in tips if "gradient_compression" in tip.setting]

    (faster,) = compression_tips("none", 0.025)
    assert faster.gain == pytest.approx(1.6)
    (slower,) = compression_tips("none", 0.05)
    assert slower.gain == pytest.approx(0.8) and "no faster here" in slower.why
    # Configured already: nothing to suggest, whatever was measured.
    assert compression_tips("fp16", 0.025) == []


def test_the_report_carries_the_compression_gain_and_counts_an_unmeasured_share_as_none(
    tmp_path: Path,
) -> None:
    config = load_config(write_experiment(tmp_path / "exp"))
    report = build_report(
        config,
        [
            probe("configured", 0.04),
            probe("no_exchange", 0.01),
            probe("compression", 0.02),
        ],
        None,
    )
    assert report.input_share is None and report.verdict is Verdict.COMMUNICATION_BOUND
    document = json.loads(json.dumps(report.as_json()))
    assert document["input_share"] is None
    (tip,) = [s for s in document["suggestions"] if "gradient_compression" in s["setting"]]
    assert tip["gain"] == pytest.approx(2.0)
    assert [p["name"] for p in document["probes"]][-1] == "compression"


def test_a_step_splits_into_compute_communication_and_input(tmp_path: Path) -> None:
    config = load_config(write_experiment(tmp_path / "exp"))
    report = build_report(
        config,
        [
            probe("configured", 0.04, input_s=0.01),
            probe("synthetic", 0.03),
            probe("no_exchange", 0.02, input_s=0.01),
        ],
        None,
    )
    split = step_split(report)
    assert split["input"] == pytest.approx(0.01)
    assert split["communication"] == pytest.approx(0.02)
    assert sum(split.values()) == pytest.approx(0.04)
    assert json.loads(json.dumps(report.as_json()))["verdict"] == report.verdict.value


def test_the_printed_table_fits_an_80_column_terminal_with_gpu_columns(tmp_path: Path) -> None:
    """Every probe's name whole and every line within 80 columns, with wide numbers."""
    config = load_config(write_experiment(tmp_path / "exp"))
    gpu = {"cpu_util_percent": 100.0, "gpu_util_percent": 97.5, "gpu_memory_used_gb": 71.9}
    names = ["configured", "synthetic", "no_exchange", "one_slot", "one_agent", "compression"]
    probes = [
        Probe(name, name, 8, 4096, probe(name, 0.0003 * (i + 1), input_s=0.0001).windows, gpu)
        for i, name in enumerate(names)
    ]
    report = build_report(config, probes, None)
    console = Console(width=80, record=True)
    print_report(report, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "…" not in console.export_text()
    rows = [line.split()[0] for line in lines if line.split() and line.split()[0] in names]
    assert rows == names
    names_line = next(i for i, line in enumerate(lines) if line.startswith("probe"))
    assert lines[names_line - 1].split() == ["step", "input", "train", "cpu", "gpu", "gpu"]
    units = ["ms", "ms", "ms", "%", "%", "GB"]
    assert lines[names_line].split() == ["probe", "slots", "samples/s", *units]


def test_agents_that_add_little_keep_the_verdict_from_scaling_well(tmp_path: Path) -> None:
    config = load_config(write_experiment(tmp_path / "exp"))
    four = Probe("configured", "", 4, 128, probe("configured", 0.04).windows)
    one_agent = Probe("one_agent", "", 2, 64, probe("one_agent", 0.004).windows)
    report = build_report(config, [four, one_agent], None)
    assert report.agent_efficiency is not None
    assert report.agent_efficiency.median == pytest.approx(0.1)
    assert report.verdict is Verdict.COMPUTE_BOUND
    alone = build_report(config, [four], None)
    assert alone.agent_efficiency is None and alone.verdict is Verdict.SCALING_WELL


# -- the plan: configs only ------------------------------------------------------------


def test_remote_ranks_probe_into_a_schema_of_the_database_dropped_after(
    postgres_url: str, tmp_path: Path
) -> None:
    """Ranks on other hosts cannot share the probes' SQLite file: their probes record in
    a schema of ``--db``'s PostgreSQL database, created and dropped by the diagnosis."""
    remote = SlurmExecutor(None)
    db = open_database(postgres_url)
    schemas = "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE :p"
    with probe_database(db, tmp_path, remote) as probe_db:
        upgrade_schema(probe_db)
        with session_scope(probe_db) as session:
            (schema,) = session.scalars(sa.text(schemas), {"p": "slotsweep_diagnose_%"})
            assert session.scalar(sa.text("SELECT current_schema()")) == schema
        assert "slotsweep_experiments" in sa.inspect(get_engine(db)).get_table_names(schema)
        assert sa.inspect(get_engine(db)).get_table_names() == []  # the user's: untouched
    with session_scope(db) as session:
        assert session.scalars(sa.text(schemas), {"p": "slotsweep_diagnose_%"}).all() == []
    # SQLite as --db: refused, as `run` refuses it; on this machine the probes' own file.
    sqlite = f"sqlite:///{tmp_path / 'u.db'}"
    with (
        pytest.raises(UsageError, match="use PostgreSQL"),
        probe_database(sqlite, tmp_path, remote),
    ):
        pass
    with probe_database(db, tmp_path, LocalExecutor()) as probe_db:
        assert probe_db == f"sqlite:///{tmp_path / 'probes.db'}"


def test_the_plan_keeps_the_per_slot_batch_and_fixes_the_point(tmp_path: Path) -> None:
    config = load_config(write_experiment(tmp_path / "exp"))
    point = point_of(config, ["global_batch_size=64"])
    plan = {p.name: p for p in probe_plan(config, point, tmp_path, agent_slots=1)}
    assert set(plan) == {"configured", "synthetic", *OPTIONAL_PROBES}
    one = plan["one_slot"].config
    assert one.resources.slots_per_trial == 1 and plan["one_slot"].samples_per_step == 32
    assert one.hyperparameters["global_batch_size"].val == 32  # type: ignore[union-attr]
    assert plan["configured"].config.hyperparameters["lr"].val == 1.0e-4  # type: ignore[union-attr]
    assert plan["synthetic"].config.profiling.synthetic_data
    assert plan["no_exchange"].config.optimizations.aggregation_frequency == 1000
    assert plan["buckets"].config.optimizations.auto_tune_tensor_fusion
    assert plan["compression"].config.optimizations.gradient_compression == "fp16"
    assert plan["one_agent"].slots == 1  # two slots span agents of one slot each


# -- real probes -------------------------------------------------------------------------


def _experiment(tmp_path: Path, slots: int = 2, **data: Any) -> Path:
    path = write_experiment(
        tmp_path / "exp",
        entrypoint="bottleneck_model:BottleneckDigitsTrial",
        resources={"slots_per_trial": slots},
        data=data,
    )
    shutil.copy(HERE / "_bottleneck_model.py", path.parent / "bottleneck_model.py")
    return path


def _diagnose(
    path: Path, db: str, capsys: pytest.CaptureFixture[str], *extra: str, slots: int = 2
) -> tuple[int, dict[str, Any] | None, str]:
    code = main(
        [
            "diagnose",
            str(path),
            "--hparams",
            "global_batch_size=64",
            "--slots",
            str(slots),
            "--db",
            db,
            "--json",
            # The shortest probes that still give three measured windows.
            "--batches",
            str(MIN_PROBE_BATCHES),
            *extra,
        ]
    )
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slots", "data", "probes", "ran", "verdicts", "bound"),
    [
        # One slot, all its plan: configured and synthetic (no exchange to probe). The
        # input pipeline is each rank's own, so one rank shows it as two would, at half
        # the processes: 0.25 ms a sample, 16 ms a batch of 64 against a step of a few ms.
        (
            1,
            {"loader_delay_s": 0.00025},
            [],
            ["configured", "synthetic"],
            {"input-bound"},
            {"input_share"},
        ),
        # Only the probe the exchange needs (compression is not named, so not run):
        # 20 ms before each step's all-reduce against a step of a few ms without it.
        (
            2,
            {"exchange_delay_s": 0.02},
            ["no_exchange"],
            ["configured", "no_exchange"],
            {"communication-bound"},
            {"communication_share"},
        ),
        # Compression named but not run: it runs only after a communication-bound verdict.
        # A step of 60 ms: on 2 cores under a load of 12 the ranks' waits for each other
        # at the all-reduce were a third of a 30 ms step (communication-bound).
        (
            2,
            {"compute_delay_s": 0.06},
            ["synthetic", "no_exchange", "compression"],
            ["configured", "synthetic", "no_exchange"],
            {"compute-bound", "scaling well"},
            set(),
        ),
    ],
    ids=["slow-loader", "slow-exchange", "neither"],
)
def test_diagnose_names_the_bottleneck_put_in(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    children_before: set[int],
    slots: int,
    data: dict[str, Any],
    probes: list[str],
    ran: list[str],
    verdicts: set[str],
    bound: set[str],
) -> None:
    """Each case runs only the probes its verdict needs, as a user may (``--probes``):
    every probe is a real trial. A share whose probe did not run is not measured."""
    db = f"sqlite:///{tmp_path / 'user.db'}"
    path = _experiment(tmp_path, slots=slots, **data)
    only = ["--probes", *probes] if probes else []
    code, report, err = _diagnose(path, db, capsys, *only, slots=slots)
    assert code == 0, err
    assert report is not None and report["verdict"] in verdicts, report
    assert [p["name"] for p in report["probes"]] == ran
    measured = {"synthetic": "input_share", "no_exchange": "communication_share"}
    for probe_name, share in measured.items():
        if probe_name not in ran:
            assert report[share] is None, (share, report)
            continue
        assert (report[share]["median"] >= BOUND_SHARE) is (share in bound), (share, report)
    assert all(len(p["windows"]) == 3 for p in report["probes"])
    with session_scope(db) as session:
        (stored,) = session.scalars(select(Diagnosis)).all()
        assert stored.verdict == report["verdict"] and stored.report == report
    assert _children() <= children_before, _children() - children_before


@pytest.mark.slow
def test_a_failing_probe_prints_its_error_and_leaves_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    children_before: set[int],
) -> None:
    # The probes' folder in a temporary directory of this test's own: other tests' probes
    # (other workers) come and go in the machine's.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    db = f"sqlite:///{tmp_path / 'user.db'}"
    # One slot: the failure and the clean-up are those of any size, at half the start-up.
    path = _experiment(tmp_path, slots=1, fail_message="no layer named 'conv9'")
    code, _, err = _diagnose(path, db, capsys, "--probes", "synthetic", slots=1)
    assert code == 1
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith("slotsweep diagnose: probe configured: rank ")
    assert "ValueError: no layer named 'conv9'" in line
    assert _children() <= children_before, _children() - children_before
    # The probes' slots were claimed in the probes' own database, gone with its folder;
    # the user's database got nothing (no diagnosis of a failed probe).
    assert "slotsweep_diagnoses" not in sa.inspect(get_engine(db)).get_table_names()
    assert not list(Path(tempfile.gettempdir()).glob("slotsweep-diagnose-*/probes.db"))


def test_bad_input_and_unplaceable_sizes_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], children_before: set[int]
) -> None:
    path = _experiment(tmp_path)
    db = f"sqlite:///{tmp_path / 'user.db'}"
    assert main(["diagnose", str(path), "--db", db, "--hparams", "lr=5"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("--hparams: lr: must be a number in")
    assert main(["diagnose", str(path), "--db", db, "--probes", "everything"]) == 2
    assert "--probes: unknown probe everything" in capsys.readouterr().err
    assert main(["diagnose", str(path), "--db", db, "--batches", "30"]) == 2
    assert "--batches: at least 40" in capsys.readouterr().err
    # Two slots per trial on one slot: refused as `run` refuses it, before anything runs.
    assert main(["run", str(path), "--db", db, "--slots", "1", "--detach"]) == 2
    refused = capsys.readouterr().err
    assert main(["diagnose", str(path), "--db", db, "--slots", "1"]) == 2
    assert capsys.readouterr().err == refused and len(refused.strip().splitlines()) == 1
    assert _children() <= children_before, _children() - children_before


@pytest.mark.slow
@pytest.mark.gpu
def test_probes_on_gpus_report_utilisation_and_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], children_before: set[int]
) -> None:
    """On GPU slots (NVML's, no cluster file) every probe carries the GPUs' use and memory."""
    from tests.gpu import cuda_device_count

    db = f"sqlite:///{tmp_path / 'user.db'}"
    # Trials as large as the machine allows (two GPUs where it has them).
    slots = min(2, cuda_device_count())
    code = main(
        [
            "diagnose",
            str(_experiment(tmp_path, slots=slots)),
            "--hparams",
            "global_batch_size=64",
            "--slots",
            str(slots),
            "--db",
            db,
            "--json",
            "--probes",
            "buckets",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    for probe in report["probes"]:
        system = probe["system"]
        assert system["gpu_util_percent"] >= 0 and system["gpu_memory_used_gb"] > 0, probe
    assert _children() <= children_before, _children() - children_before
