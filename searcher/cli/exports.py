"""The CLI's commands for other tools: ``slotsweep tensorboard`` and ``slotsweep export mlflow``.

:func:`add_commands` adds them to the parser :mod:`searcher.cli` builds, with that
parser's own ``--db`` and ``EXPERIMENT`` arguments; :data:`HANDLERS` runs them. Kept
out of ``cli.py`` so each command family is one module.

Example:
    $ slotsweep tensorboard 3                      # files, then TensorBoard on 127.0.0.1:6006
    $ slotsweep tensorboard 3 --logdir runs/tb3    # only the files
    $ slotsweep export mlflow 3 --tracking-uri http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# How often `slotsweep tensorboard` appends what the search recorded since.
APPEND_EVERY_S = 5.0
# How long TensorBoard has to exit on SIGTERM before it is killed.
STOP_GRACE_S = 10.0

Adder = Callable[[argparse.ArgumentParser], None]


def add_commands(
    commands: Any, *, add_db: Adder, add_experiment: Adder, port: Callable[[str], int]
) -> None:
    """Add ``tensorboard`` and ``export`` to ``commands`` (``add_subparsers``'s result)."""
    board = commands.add_parser(
        "tensorboard",
        help="write an experiment's TensorBoard event files and start TensorBoard on them",
    )
    add_experiment(board)
    add_db(board)
    board.add_argument(
        "--logdir",
        metavar="DIR",
        default=None,
        help="only write (or append to) the event files in DIR; start no TensorBoard",
    )
    board.add_argument(
        "--host", default="127.0.0.1", help="address TensorBoard binds (default 127.0.0.1)"
    )
    board.add_argument("--port", type=port, default=6006, help="TensorBoard's port (default 6006)")

    export = commands.add_parser("export", help="copy an experiment into another tool")
    targets = export.add_subparsers(
        dest="export_target", metavar="TOOL", parser_class=type(export)
    )
    targets.required = True
    mlflow = targets.add_parser("mlflow", help="log every trial as an MLflow run (nested)")
    add_experiment(mlflow)
    add_db(mlflow)
    mlflow.add_argument(
        "--tracking-uri", required=True, metavar="URI", help="the MLflow tracking server"
    )
    mlflow.add_argument(
        "--experiment-name",
        metavar="NAME",
        default=None,
        help="the MLflow experiment (default: the slotsweep experiment's name)",
    )


def _open(args: argparse.Namespace) -> tuple[str, int]:
    """The database and the experiment's id, as every command resolves them."""
    from searcher.experiments import find_experiment
    from searcher.submit.submission import open_database
    from storage import session_scope

    db_url = open_database(args.db, need_schema=True)
    with session_scope(db_url) as session:
        return db_url, find_experiment(session, args.experiment).id


def cmd_tensorboard(args: argparse.Namespace) -> int:
    """Write the event files; without ``--logdir``, serve them and append until Ctrl-C."""
    from searcher.integrations import TensorBoardExport, require
    from searcher.logs import stored_experiment_log_dir

    require("tensorboard", extra="tensorboard")
    db_url, experiment_id = _open(args)
    logdir = Path(
        args.logdir or stored_experiment_log_dir(db_url, experiment_id) / "tensorboard"
    ).resolve()
    export = TensorBoardExport(db_url, experiment_id, logdir)
    written = export.write()
    if args.logdir is not None:
        export.close()
        print(f"experiment {experiment_id}: {written} values written to {logdir}")
        return 0
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            f"--logdir={logdir}",
            f"--host={args.host}",
            f"--port={args.port}",
            "--reload_interval=5",
        ],
        stdin=subprocess.DEVNULL,
    )
    print(
        f"experiment {experiment_id}: TensorBoard (pid {board.pid}) at "
        f"http://{args.host}:{args.port}/ on {logdir}; Ctrl-C stops it",
        flush=True,
    )
    # SIGTERM ends this command as Ctrl-C does: TensorBoard is stopped with it.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while board.poll() is None:
            time.sleep(APPEND_EVERY_S)
            export.write()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        export.close()
        _stop(board)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``export mlflow``: log the experiment's trials to MLflow, all that is missing."""
    from searcher.experiments import UsageError
    from searcher.integrations import MlflowExport

    db_url, experiment_id = _open(args)
    export = MlflowExport(
        db_url,
        experiment_id,
        tracking_uri=args.tracking_uri,
        experiment_name=args.experiment_name,
    )
    # A sync makes new trials' runs and the next gives them their metrics: on until
    # all is logged (a running search is exported as far as it got).
    try:
        while not export.sync() and export.changed:
            pass
    except Exception as exc:  # whatever MLflow's client raises: one line, not its traceback
        message = str(exc).strip().splitlines()
        raise UsageError(
            f"--tracking-uri: MLflow at {args.tracking_uri} failed: "
            f"{type(exc).__name__}: {message[0] if message else ''}"
        ) from None
    print(f"experiment {experiment_id}: exported to MLflow at {args.tracking_uri}")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(process: subprocess.Popen[bytes]) -> None:
    """End TensorBoard and what it started: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`.

    TensorBoard starts its data server as a child that exits only when it notices its
    parent gone; it is ended here too, so nothing outlives the command.
    """
    import psutil

    if process.poll() is not None:
        return
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=STOP_GRACE_S)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "tensorboard": cmd_tensorboard,
    "export": cmd_export,
}
