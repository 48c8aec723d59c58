"""What the docstring examples of searcher/, trials/, storage/ and ui/ run with.

``pytest`` collects those packages with ``--doctest-modules`` (pyproject.toml), so every
``>>>`` example runs in CI and must show its real output. An example may use these
names without defining them, as a reader of the docstring would assume them:

- ``config``: the experiment config of ``examples/digits/experiment.yaml``;
- ``folder``: a fresh empty folder of the example's own;
- ``url``: a SQLite database in ``folder`` holding slotsweep's schema and one
  experiment (id 1, ``config``, its Optuna study ``digits-large-batch-1``) with one
  trial, asked from the study as the driver asks it: QUEUED, id 1, Optuna number 0;
- ``pool``: pool ``default`` of one agent on this machine, ``local``, with slots 0 and 1;
- ``ctx``: the driver's view of experiment 1 in ``url`` (local executor, ``pool``);
- ``trial``: trial 1's row as the driver read it (a detached ``storage.Trial``);
- ``spec``: the runtime spec of trial 1's attempt 0 (what its ranks are given);
- ``context``: the ``PyTorchTrialContext`` a rank of a one-rank job builds from ``spec``
  (on the CPU, no database writes).

Examples run from the repository root, so a path like ``examples/digits`` reads as in
the README. The database is built only for an example that names ``url``, ``ctx``,
``trial``, ``spec`` or ``context``:
the other examples, most of them, then cost no more than their own calls.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem, DoctestModule

from trials.scheduler import DEFAULT_POOL, Agent, ResourcePool

# Modules that must not be imported to look for examples: importing them does their
# work. Everything else in the four packages is imported, and importing it starts no
# process, server or browser.
collect_ignore = [
    # Alembic's migration script: importing it runs the migrations, and only inside
    # Alembic's own `context` (storage/_migrate.py runs it that way).
    "storage/migrations/env.py",
    # Streamlit scripts render their page when imported (`streamlit run ui/app.py` runs
    # them): outside a server that would open `sqlite:///slotsweep.db` in the working
    # directory and query it.
    "ui/app.py",
    "ui/views",
]


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    """Look for examples in the four packages only, not in the modules of tests/.

    ``--doctest-modules`` would import every module of tests/ once more, the models of
    tests/searcher among them, which import what only their trial's folder holds.
    """
    collectors = yield
    if file_path.is_relative_to(parent.config.rootpath / "tests"):
        return [c for c in collectors if not isinstance(c, DoctestModule)]
    return collectors


EXAMPLE_CONFIG = "examples/digits/experiment.yaml"
# Not this machine's own cluster: what it has (GPUs, $SLOTSWEEP_CLUSTER) must not change
# what an example prints.
_POOL = ResourcePool(DEFAULT_POOL, (Agent("local", "127.0.0.1", (0, 1)),))
_NEEDS_DATABASE = re.compile(r"\b(url|ctx|trial|spec|context)\b")


@pytest.fixture(scope="session")
def _example_database_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database every ``url`` starts as, built once per test process (a copy is cheap)."""
    from searcher.driver.placement import PendingQueue
    from searcher.driver.study_side import StudySide, TellQueue
    from searcher.submit.creation import create_experiment
    from trials.config import load_config

    config = load_config(EXAMPLE_CONFIG)
    path = tmp_path_factory.mktemp("example-database") / "slotsweep.db"
    url = f"sqlite:///{path}"
    create_experiment(
        config, config_path=Path(EXAMPLE_CONFIG), db_url=url, directions=["minimize"]
    )
    ctx = _driver_context(url, config, path.parent)
    StudySide.load(ctx, trials_so_far=0, tells=TellQueue()).fill_queue(0, PendingQueue(ctx))
    return path


def _driver_context(url: str, config: Any, folder: Path) -> Any:
    """Experiment 1 of ``url`` as its driver sees it: the local executor on ``pool``."""
    from searcher.driver.context import DriverContext
    from storage import Experiment, session_scope
    from trials.executors import LocalExecutor
    from trials.timings import Timings

    with session_scope(url) as session:
        experiment = session.get(Experiment, 1)
        assert experiment is not None
        checkpoint_folder = experiment.checkpoint_folder
    return DriverContext(
        db_url=url,
        experiment_id=1,
        study_name=f"{config.name}-1",
        model_dir=Path(EXAMPLE_CONFIG).resolve().parent,
        config=config,
        pool=_POOL,
        executor=LocalExecutor(use_gpus=False),
        run_dir=folder / "logs/experiment-1",
        timings=Timings(),
        checkpoint_folder=checkpoint_folder,
    )


def _example_database(template: Path, folder: Path, config: Any) -> dict[str, Any]:
    """``url``, ``ctx``, ``trial``, ``spec``, ``context``: a copy of the template database."""
    from sqlalchemy import select

    from searcher.driver.runtime_spec import build_runtime_spec
    from storage import Trial, session_scope
    from trials.runtime import CpuAccelerator, DistributedInfo, PyTorchTrialContext

    path = folder / "slotsweep.db"
    # SQLite's backup copies what the WAL file holds too, unlike copying the file.
    with sqlite3.connect(template) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    url = f"sqlite:///{path}"
    with session_scope(url) as session:
        (trial,) = session.scalars(select(Trial))
    ctx = _driver_context(url, config, folder)
    spec = build_runtime_spec(ctx, trial, attempt=0, checkpoint=None)
    context = PyTorchTrialContext(spec, DistributedInfo.from_env({}), CpuAccelerator())
    return {"url": url, "ctx": ctx, "trial": trial, "spec": spec, "context": context}


@pytest.fixture(autouse=True)
def _example_names(request: pytest.FixtureRequest) -> None:
    """Give a docstring example the names the module docstring above lists.

    Autouse, so it sees every test: the fixtures it needs are asked for only for a
    docstring example, and a test of tests/ gets none of them.
    """
    if not isinstance(request.node, DoctestItem):
        return
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    doctest_namespace: dict[str, Any] = request.getfixturevalue("doctest_namespace")
    from trials.config import load_config

    monkeypatch.chdir(request.config.rootpath)
    folder: Path = request.getfixturevalue("tmp_path")
    config = load_config(EXAMPLE_CONFIG)
    names: dict[str, Any] = {"config": config, "folder": folder, "pool": _POOL}
    source = "".join(example.source for example in request.node.dtest.examples)
    if _NEEDS_DATABASE.search(source):
        template = request.getfixturevalue("_example_database_template")
        names.update(_example_database(template, folder, config))
    # The namespace is one dict for the whole session: no name survives its example.
    doctest_namespace.clear()
    doctest_namespace.update(names)
