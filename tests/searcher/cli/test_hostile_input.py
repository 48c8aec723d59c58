"""Hostile and odd input: one line per problem, exit code 2, nothing written, bounded cost.

Hundreds of malformed experiment and cluster files go through ``searcher.cli.main``, the
function the ``slotsweep`` console script calls, in this process (so they run in
seconds); ``tests/searcher/cli/test_errors.py`` runs a few of the same through real processes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searcher.cli import main
from searcher.cli.commands import MAX_PROBLEMS_SHOWN

_EXPERIMENT: dict[str, Any] = {
    "name": "hostile",
    "entrypoint": "model:Trial",
    "hyperparameters": {
        "global_batch_size": {"type": "categorical", "vals": [32, 64]},
        "lr": {"type": "log", "minval": 1e-4, "maxval": 1e-1},
        "warmup": {"type": "int", "minval": 0, "maxval": 3},
        "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    },
    "searcher": {
        "name": "random",
        "metric": "val_loss",
        "max_trials": 2,
        "max_length": {"epochs": 1},
    },
    "resources": {"slots_per_trial": 1},
    "profiling": {"system_metrics_interval_s": 5.0},
    "data": {"rows": 10},
}
_CLUSTER: dict[str, Any] = {
    "resource_pools": [
        {"name": "default", "agents": [{"name": "a1", "host": "127.0.0.1", "slots": 2}]}
    ]
}

_HUGE = st.sampled_from([10**30, -(10**30), 1e100, 2**63, 2**31, 1e308])
# Beyond every bound, also those that admit 2**31 (a seed, an int hyperparameter's range).
_HUGER = st.sampled_from([10**30, -(10**30), 1e100, 2**63, 1e308])
_NON_FINITE = st.sampled_from([float("inf"), float("-inf"), float("nan")])
_WRONG_TYPE = st.sampled_from(["many", [], {}, [1, 2], {"a": 1}, True, None])
_NOT_A_BOOLEAN = st.sampled_from([1, 0, "yes", "true", "false", 1.0, "on"])
_UNKNOWN_KEY = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)

# (path, values that are wrong there whatever else the file holds)
_EXPERIMENT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["", "x" * 300, 5, [], {}]),
    "entrypoint": st.sampled_from(["model", "model.Trial", ":Trial", 3, [], "nowhere:Trial"]),
    "hyperparameters": st.sampled_from([[], "lr", {}, 3]),
    "hyperparameters.lr.minval": _NON_FINITE | _HUGE | _WRONG_TYPE | st.just(0.5),
    "hyperparameters.lr.maxval": _NON_FINITE | _WRONG_TYPE | st.just(-1.0),
    "hyperparameters.warmup.maxval": _HUGER | _NON_FINITE | _WRONG_TYPE | st.just(-1),
    "hyperparameters.warmup.count": _HUGE | st.sampled_from([0, -3, "two"]),
    "hyperparameters.dropout.minval": _NON_FINITE | st.sampled_from([0.5, 1.0]),
    "hyperparameters.global_batch_size": _HUGE
    | _NON_FINITE
    | st.sampled_from([0, "big", 1.5, {"type": "categorical", "vals": [64, 64]}]),
    "hyperparameters.bad-name": st.just(1),
    "hyperparameters.9lives": st.just(1),
    "searcher.max_trials": _HUGE | _NON_FINITE | st.sampled_from([0, -1, "all", 2.5]),
    "searcher.name": st.sampled_from(["bayes", "", 3, None]),
    "searcher.max_length": st.sampled_from([{}, {"epochs": 0}, {"epochs": 1, "batches": 2}, 5]),
    "searcher.max_length.epochs": _HUGE | _NON_FINITE | st.just(0),
    "searcher.seed": _HUGER | st.just(-1),
    "resources.slots_per_trial": _HUGE | _NON_FINITE | st.sampled_from([0, "two"]),
    "resources.priority": st.sampled_from([0, 100, 10**30]),
    # Booleans are YAML's true and false only: pydantic's lax mode would take these.
    "resources.reuse_workers": _NOT_A_BOOLEAN,
    "searcher.smaller_is_better": _NOT_A_BOOLEAN,
    "profiling.enabled": _NOT_A_BOOLEAN,
    "profiling.system_metrics_interval_s": _NON_FINITE | _HUGE | st.sampled_from([0, -1]),
    "optimizations": st.sampled_from([{"tensor_fusion_threshold": float("inf")}, [], 1]),
    "max_restarts": _HUGE | st.sampled_from([-1, "often"]),
    "hang_timeout_s": _NON_FINITE | _HUGE | st.sampled_from([0, -5, "soon"]),
    "data": st.sampled_from([[], 3, {"x": float("inf")}, {"x": [1, float("nan")]}]),
}
_CLUSTER_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "resource_pools": st.sampled_from([[], {}, "default", 3]),
    "resource_pools.0.name": st.sampled_from(["", 3, [], "x" * 300]),
    "resource_pools.0.fitting_policy": st.sampled_from(["first", 1, None]),
    "resource_pools.0.agents": st.sampled_from([[], {}, "a1"]),
    "resource_pools.0.agents.0.slots": _HUGE
    | _NON_FINITE
    | st.sampled_from([0, -1, "two", [], [0, 0], [0, 5000], [-1], True, 4097]),
    "resource_pools.0.agents.0.name": st.sampled_from(["", 7, None]),
    "resource_pools.0.agents.0.host": st.sampled_from(["", 7, "h" * 300]),
    "resource_pools.0.preemption": _NOT_A_BOOLEAN,
    "resource_pools.0.allowing_heterogeneous_fits": _NOT_A_BOOLEAN,
    "dtrain_network_interface": st.sampled_from(
        ["eth0; rm -rf /", "", "x" * 16, ".", "..", "eth0:1", "a/b", 7]
    ),
    "slurm.time_limit": st.sampled_from(["25:99", "99:99:99", "1-25:00:00", "4 hours"]),
    "slurm.sbatch_options": st.sampled_from(
        [["--output", "/etc/x"], ["-o/etc/x"], ["-pother"], ["-Jrenamed"], ["--part=x"], ["--mem"]]
    ),
}


def _set(document: dict[str, Any], dotted: str, value: Any) -> None:
    """Put ``value`` at ``dotted``; skipped where an earlier problem replaced a parent."""
    node: Any = document
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            if last:
                node[int(part)] = value
            node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            node = node.setdefault(part, {})
        else:
            return  # That earlier problem is still in the file.


def _alias_bomb(key: str) -> str:
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 9)]
    return f"{key}:\n" + "".join(f"  - {level}\n" for level in levels)


@st.composite
def _malformed(
    draw: st.DrawFn,
    base: dict[str, Any],
    fields: dict[str, st.SearchStrategy[Any]],
    required: list[str],
) -> bytes:
    """``base`` with one to four problems, as the bytes of a file."""
    document = copy.deepcopy(base)
    text_edits: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(
                ["field", "field", "field", "missing", "unknown", "bytes", "bomb", "duplicate"]
            )
        )
        if kind == "field":
            path = draw(st.sampled_from(sorted(fields)))
            _set(document, path, draw(fields[path]))
        elif kind == "missing":
            document.pop(draw(st.sampled_from(required)), None)
            if not document:
                document["nothing"] = 1  # An empty mapping would be valid YAML but no file.
        elif kind == "unknown":
            document[f"unknown_{draw(_UNKNOWN_KEY)}"] = draw(_WRONG_TYPE | _HUGE)
        else:
            text_edits.append(kind)
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    for kind in text_edits:
        if kind == "bomb":
            text += _alias_bomb(f"bomb_{draw(_UNKNOWN_KEY)}")
        elif kind == "duplicate":
            first_key = text.split(":", 1)[0]
            text += f"{first_key}: again\n"
    raw = text.encode()
    if "bytes" in text_edits:
        where = draw(st.integers(0, len(raw)))
        junk = draw(st.sampled_from([b"\xff\xfe", b"\xe9", b"\x00", b"\x80abc", b"\xc3("]))
        raw = raw[:where] + junk + raw[where:]
    return raw


def _run_cli(argv: list[str]) -> tuple[int, str]:
    """``slotsweep ARGV`` in this process: its exit code and what it printed to stderr."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors exit through SystemExit.
            code = exc.code if isinstance(exc.code, int) else 1
    return code, stderr.getvalue()


def _assert_refused(argv: list[str], db: Path) -> list[str]:
    started = time.monotonic()
    code, stderr = _run_cli(argv)
    # Bounded, not timed: a case takes milliseconds; only a hang or an alias bomb that
    # expands could take this long, even on a loaded machine.
    assert time.monotonic() - started < 60, argv
    assert code == 2, (code, stderr)
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert 1 <= len(lines) <= MAX_PROBLEMS_SHOWN + 1, lines
    assert all(": " in line or line.startswith("and ") for line in lines), lines
    assert not db.exists(), "a database was written"
    return lines


def _write_model(folder: Path) -> None:
    (folder / "model.py").write_text("class Trial: ...\n")


_FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


@pytest.fixture(scope="module")
def peak_memory() -> Any:
    """The test module's growth of this process's peak memory stays bounded."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 500, f"peak memory grew by {grown_mib:.0f} MiB"


@settings(_FUZZ, max_examples=350)
@given(
    content=_malformed(
        _EXPERIMENT, _EXPERIMENT_FIELDS, ["name", "entrypoint", "hyperparameters", "searcher"]
    )
)
def test_malformed_experiment_files_exit_2_with_one_line_per_problem(
    content: bytes, peak_memory: None
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _write_model(root)
        config = root / "experiment.yaml"
        config.write_bytes(content)
        db = root / "fuzz.db"
        _assert_refused(["run", str(config), "--db", f"sqlite:///{db}", "--slots", "2"], db)


@settings(_FUZZ, max_examples=200)
@given(content=_malformed(_CLUSTER, _CLUSTER_FIELDS, ["resource_pools"]))
def test_malformed_cluster_files_exit_2_with_one_line_per_problem(
    content: bytes, peak_memory: None
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _write_model(root)
        config = root / "experiment.yaml"
        config.write_text(yaml.safe_dump(_EXPERIMENT))
        cluster = root / "cluster.yaml"
        cluster.write_bytes(content)
        db = root / "fuzz.db"
        for argv in (
            ["agents", "--cluster", str(cluster)],
            ["run", str(config), "--db", f"sqlite:///{db}", "--cluster", str(cluster)],
        ):
            lines = _assert_refused(argv, db)
            assert all(line.startswith(("cluster", "and ")) for line in lines), lines


def test_problems_beyond_fifty_are_counted_not_printed(tmp_path: Path) -> None:
    _write_model(tmp_path)
    document = {**_EXPERIMENT, **{f"unknown_{n:05d}": n for n in range(20_000)}}
    config = tmp_path / "experiment.yaml"
    config.write_text(yaml.safe_dump(document))
    db = tmp_path / "out.db"
    lines = _assert_refused(["run", str(config), "--db", f"sqlite:///{db}"], db)
    assert len(lines) == MAX_PROBLEMS_SHOWN + 1
    assert lines[0].startswith("unknown_00000: unknown field; allowed: name, ")
    assert lines[-1] == f"and {20_000 - MAX_PROBLEMS_SHOWN} more problems"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["run", "x.yaml", "--slots", "100000000"], "--slots must be an integer from 1 to 4096"),
        (["run", "x.yaml", "--slots", "1e3"], "--slots must be an integer from 1 to 4096"),
        (["ui", "--port", "70000"], "--port must be an integer from 1 to 65535"),
        (["ui", "--port", "0"], "--port must be an integer from 1 to 65535"),
        (["resume", "e", "--slots", "-2"], "--slots must be an integer from 1 to 4096"),
    ],
)
def test_arguments_out_of_range_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], problem: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, stderr = _run_cli(argv)
    assert code == 2
    [line] = stderr.splitlines()
    assert problem in line
    assert list(tmp_path.iterdir()) == []


_READ_COMMANDS = [
    ["resume", "e"],
    ["activate", "e"],
    ["pause", "e"],
    ["kill", "e"],
    ["enqueue", "e", "lr=0.01"],
    ["describe", "e"],
    ["list"],
    ["task", "list"],
]


@pytest.mark.parametrize("command", _READ_COMMANDS, ids=lambda argv: "-".join(argv[:2]))
def test_commands_on_a_new_database_say_so_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLOTSWEEP_DB", raising=False)
    db = tmp_path / "new.db"
    code, stderr = _run_cli([*command, "--db", f"sqlite:///{db}"])
    assert code == 2
    assert stderr.splitlines() == [
        f"--db: {db} is not a slotsweep database (the file does not exist); "
        "`slotsweep run CONFIG --db ...` creates one"
    ]
    assert list(tmp_path.iterdir()) == []
    # The default database (no --db) is checked the same way.
    code, stderr = _run_cli(command)
    assert code == 2 and "slotsweep.db is not a slotsweep database" in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_file_without_the_schema_is_left_unchanged(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
        connection.commit()
    before = db.read_bytes()
    for command in _READ_COMMANDS:
        code, stderr = _run_cli([*command, "--db", f"sqlite:///{db}"])
        assert code == 2
        assert stderr.splitlines() == [
            f"--db: {db} is not a slotsweep database (it holds no slotsweep tables); "
            "`slotsweep run CONFIG --db ...` creates one"
        ]
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


@pytest.mark.parametrize("command", [*_READ_COMMANDS, ["run", "experiment.yaml"]])
def test_a_file_that_is_not_sqlite_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _write_model(tmp_path)
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(_EXPERIMENT))
    not_db = tmp_path / "notes.txt"
    not_db.write_text("these are not the tables you are looking for\n")
    code, stderr = _run_cli([*command, "--db", f"sqlite:///{not_db}", *_slots(command)])
    assert code == 2
    assert stderr.splitlines() == [f"--db: {not_db} is not a SQLite database"]
    assert not_db.read_text() == "these are not the tables you are looking for\n"


def _slots(command: list[str]) -> list[str]:
    return ["--slots", "2"] if command[0] == "run" else []


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"]
)
@pytest.mark.parametrize("command", [["run", "experiment.yaml"], ["list"], ["resume", "e"]])
def test_an_in_memory_database_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _write_model(tmp_path)
    (tmp_path / "experiment.yaml").write_text(yaml.safe_dump(_EXPERIMENT))
    code, stderr = _run_cli([*command, "--db", url, *_slots(command)])
    assert code == 2
    assert stderr.splitlines() == [
        "--db: an in-memory SQLite database cannot be shared with the trial processes; "
        "use a file, e.g. sqlite:///slotsweep.db"
    ]


def test_a_missing_postgres_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if psycopg were not installed: importing it fails as a missing module does.
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    url = "postgresql+psycopg://me:hunter2@127.0.0.1:1/sweeps"
    code, stderr = _run_cli(["list", "--db", url])
    assert code == 2
    [line] = stderr.splitlines()
    assert line.startswith("--db: the PostgreSQL driver psycopg is not installed")
    assert line.endswith("pip install 'slotsweep[postgres]'")
    code, stderr = _run_cli(["list", "--db", "postgresql://me:hunter2@127.0.0.1:1/sweeps"])
    assert code == 2
    assert "pip install 'slotsweep[postgres]'" in stderr
    assert "hunter2" not in stderr
