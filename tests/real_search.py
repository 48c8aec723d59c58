"""A real small search through ``slotsweep run``, for the UI tests to look at (and the
CLI's end-to-end test, tests/searcher/test_search_e2e.py).

:func:`run_real_search` copies ``examples/digits`` (through the searcher tests'
``write_experiment``) and runs the CLI as a subprocess: TPE with a fixed seed, ASHA
pruning, 3 trials of 2 slots and 2 epochs, one trial at a time on a 4-slot agent.
Every row the pages show then comes from the driver, ``torchrun`` and the in-rank
runtime: trial states, ``loss``/``lr``/``val_loss``/``val_accuracy`` metrics,
checkpoints kept or deleted by retention, ``[rank N]`` log lines, profiling windows
and psutil system metrics.

While the search runs, a reader thread copies the database (SQLite's online backup,
one consistent snapshot) the first time a trial holds its slots after another trial
has ended: a real experiment caught mid-run, with a RUNNING trial that has recorded
nothing yet. The thread reads the way the UI does, so it also shows that reading
during a search does not break it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import threading
from pathlib import Path

import yaml

from tests.conftest import cli_environment
from tests.searcher.conftest import run_cli, write_experiment

EXPERIMENT_NAME = "ui-digits"
MAX_TRIALS = 3
AGENT = "agent-0"
AGENT_SLOTS = 4
SEARCH_TIMEOUT_S = 480.0
# A trial holds its slots and has started a run, and an earlier trial has ended.
_RUNNING_AFTER_ONE_ENDED = """
SELECT t.id FROM slotsweep_trials AS t
JOIN slotsweep_allocations AS a ON a.trial_id = t.id
JOIN slotsweep_trial_runs AS r ON r.trial_id = t.id AND r.ended_at IS NULL
WHERE t.state = 'RUNNING'
  AND EXISTS (SELECT 1 FROM slotsweep_trials WHERE ended_at IS NOT NULL)
LIMIT 1
"""


@dataclasses.dataclass(frozen=True)
class RealSearch:
    """Where one real ``slotsweep run`` left its database, and the ids tests look up.

    Everything else (states, metrics, checkpoints) is read from the database by each
    test, so the assertions hold whatever the search decided (which trials ASHA pruned).
    """

    url: str
    running_url: str
    running_trial_id: int
    cluster_file: Path
    root: Path
    experiment_id: int
    name: str
    study_name: str
    #: What ``slotsweep run`` printed (stdout, then stderr).
    output: str = ""


def _write_cluster_file(path: Path) -> Path:
    layout = {
        "resource_pools": [
            {
                "name": "default",
                "agents": [{"name": AGENT, "host": "127.0.0.1", "slots": AGENT_SLOTS}],
            }
        ]
    }
    path.write_text(yaml.safe_dump(layout, sort_keys=False))
    return path


class _MidRunSnapshot(threading.Thread):
    """Copies the database once, while a trial runs after another has ended."""

    def __init__(self, db_path: Path, target: Path) -> None:
        super().__init__(name="mid-run-snapshot", daemon=True)
        self.db_path = db_path
        self.target = target
        self.stop = threading.Event()
        self.trial_id: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.trial_id is None and not self.stop.wait(0.1):
                if self.db_path.exists():
                    self.trial_id = self._try_copy()
        except BaseException as exc:  # Reported by the fixture, not lost in the thread.
            self.error = exc

    def _try_copy(self) -> int | None:
        uri = f"file:{self.db_path}?mode=ro"
        with contextlib.closing(
            sqlite3.connect(uri, uri=True, timeout=1, isolation_level=None)
        ) as src:
            try:
                # One read transaction: the row found and the copy are the same snapshot.
                src.execute("BEGIN")
                row = src.execute(_RUNNING_AFTER_ONE_ENDED).fetchone()
                if row is None:
                    return None
                with contextlib.closing(sqlite3.connect(self.target)) as dst:
                    src.backup(dst)
                return int(row[0])
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None  # The driver has not created the schema yet.
                raise
            finally:
                if src.in_transaction:
                    src.execute("ROLLBACK")


def run_real_search(root: Path) -> RealSearch:
    """Run the small digits search under ``root`` through the CLI; fail loudly if it did not."""
    root.mkdir(parents=True, exist_ok=True)
    config = write_experiment(
        root / "exp",
        name=EXPERIMENT_NAME,
        searcher={
            "name": "tpe",
            "seed": 0,
            "pruner": {"name": "asha", "min_resource": 1, "reduction_factor": 3},
            "max_trials": MAX_TRIALS,
            "max_length": {"epochs": 2},
            "max_concurrent_trials": 1,
        },
    )
    cluster_file = _write_cluster_file(root / "cluster.yaml")
    db_path = root / "slotsweep.db"
    url = f"sqlite:///{db_path}"
    snapshot = _MidRunSnapshot(db_path, root / "mid-run.db")
    snapshot.start()
    try:
        result = run_cli(
            ["run", str(config), "--db", url, "--cluster", str(cluster_file), "--no-progress"],
            cli_environment(),
            root,
            timeout=SEARCH_TIMEOUT_S,
        )
    finally:
        snapshot.stop.set()
        snapshot.join(timeout=30)
    assert result.returncode == 0, (
        f"slotsweep run exited {result.returncode}:\n{result.stdout[-3000:]}\n"
        f"{result.stderr[-6000:]}"
    )
    assert snapshot.error is None, f"the mid-run snapshot failed: {snapshot.error!r}"
    assert snapshot.trial_id is not None, "no trial was seen running after another had ended"

    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        experiment_id, name, study_name, state = conn.execute(
            "SELECT id, name, study_name, state FROM slotsweep_experiments"
        ).fetchone()
        states = [s for (s,) in conn.execute("SELECT state FROM slotsweep_trials ORDER BY id")]
    assert state == "COMPLETED", state
    # ASHA may prune any trial but the first (nothing to compare it with); none may fail.
    assert len(states) == MAX_TRIALS and states[0] == "COMPLETED", states
    assert set(states) <= {"COMPLETED", "PRUNED"}, states
    return RealSearch(
        url=url,
        running_url=f"sqlite:///{snapshot.target}",
        running_trial_id=snapshot.trial_id,
        cluster_file=cluster_file,
        root=root,
        experiment_id=int(experiment_id),
        name=str(name),
        study_name=str(study_name),
        output=result.stdout + result.stderr,
    )


FAILING_EXPERIMENT_NAME = "ui-broken"
FAILING_TRIALS = 2
FAILURE_MESSAGE = "the data loader found no shards under /data/missing"
_BROKEN_MODEL = f'''
"""A trial that fails as a misconfigured one does: every rank raises before training."""

from model import DigitsTrial


class BrokenTrial(DigitsTrial):
    def __init__(self, context):
        raise FileNotFoundError("{FAILURE_MESSAGE}")
'''


def run_failing_search(root: Path) -> RealSearch:
    """A real ``slotsweep run`` whose every trial fails (no restarts); fail if it did not.

    The UI must show such an experiment as failed, with the reason its trials recorded.
    ``running_url`` and ``running_trial_id`` are the finished database and its first trial.
    """
    root.mkdir(parents=True, exist_ok=True)
    config = write_experiment(
        root / "exp",
        name=FAILING_EXPERIMENT_NAME,
        entrypoint="broken:BrokenTrial",
        searcher={"max_trials": FAILING_TRIALS, "max_concurrent_trials": 1},
        max_restarts=0,
    )
    (root / "exp" / "broken.py").write_text(_BROKEN_MODEL)
    cluster_file = _write_cluster_file(root / "cluster.yaml")
    db_path = root / "slotsweep.db"
    url = f"sqlite:///{db_path}"
    result = run_cli(
        ["run", str(config), "--db", url, "--cluster", str(cluster_file), "--no-progress"],
        cli_environment(),
        root,
        timeout=SEARCH_TIMEOUT_S,
    )
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        experiment_id, name, study_name = conn.execute(
            "SELECT id, name, study_name FROM slotsweep_experiments"
        ).fetchone()
        trials = conn.execute("SELECT id, state FROM slotsweep_trials ORDER BY id").fetchall()
    assert [state for _, state in trials] == ["ERROR"] * FAILING_TRIALS, (
        f"slotsweep run exited {result.returncode}; trials {trials}:\n{result.stderr[-4000:]}"
    )
    return RealSearch(
        url=url,
        running_url=url,
        running_trial_id=int(trials[0][0]),
        cluster_file=cluster_file,
        root=root,
        experiment_id=int(experiment_id),
        name=str(name),
        study_name=str(study_name),
    )
