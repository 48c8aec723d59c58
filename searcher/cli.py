"""The ``slotsweep`` command line.

Every user mistake prints one line naming the argument or field and what is allowed,
exits with code 2 and writes nothing.

Example:
    $ slotsweep run examples/digits/experiment.yaml
    $ slotsweep list
    $ slotsweep describe digits-large-batch
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the message already names the argument.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        default=None,
        help="database URL (default: $SLOTSWEEP_DB or sqlite:///slotsweep.db)",
    )


def _add_cluster(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        metavar="FILE",
        default=None,
        help="cluster file with resource pools and agents (default: $SLOTSWEEP_CLUSTER "
        "or this machine as one agent)",
    )
    parser.add_argument(
        "--slots",
        type=_positive_int("--slots"),
        default=None,
        help="slots of the local agent (default: GPUs, or CPU cores without GPUs)",
    )


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a positive integer, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="slotsweep", description="Hyperparameter search over distributed trials."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser("run", help="validate an experiment config and run its search")
    run.add_argument("config", metavar="CONFIG", help="experiment YAML file")
    _add_db(run)
    _add_cluster(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--detach", action="store_true", help="create the experiment and exit without running it"
    )

    for name, text in (
        ("resume", "continue an experiment from the database"),
        ("activate", "alias of resume"),
    ):
        resume = commands.add_parser(name, help=text)
        resume.add_argument("experiment", metavar="EXPERIMENT", help="experiment id or name")
        _add_db(resume)
        _add_cluster(resume)
        resume.add_argument("--no-progress", action="store_true", help="no progress bar")

    listing = commands.add_parser("list", help="experiments with state, trial counts, best value")
    _add_db(listing)

    describe = commands.add_parser("describe", help="an experiment's trials")
    describe.add_argument("experiment", metavar="EXPERIMENT", help="experiment id or name")
    _add_db(describe)

    for name, text in (
        ("pause", "ask a running experiment to checkpoint its trials and pause"),
        ("kill", "stop an experiment now and cancel it"),
    ):
        control = commands.add_parser(name, help=text)
        control.add_argument("experiment", metavar="EXPERIMENT", help="experiment id or name")
        _add_db(control)

    enqueue = commands.add_parser("enqueue", help="add a trial with given hyperparameters")
    enqueue.add_argument("experiment", metavar="EXPERIMENT", help="experiment id or name")
    enqueue.add_argument("params", metavar="KEY=VALUE", nargs="+", help="hyperparameter values")
    _add_db(enqueue)

    task = commands.add_parser("task", help="tasks on the cluster")
    task_commands = task.add_subparsers(
        dest="task_command", metavar="SUBCOMMAND", parser_class=_Parser
    )
    task_commands.required = True
    task_list = task_commands.add_parser("list", help="every slot and the trial holding it")
    _add_db(task_list)
    _add_cluster(task_list)

    agents = commands.add_parser("agents", help="agents and resource pools")
    _add_cluster(agents)

    ui = commands.add_parser("ui", help="start the web UI")
    _add_db(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=_positive_int("--port"), default=8501, help="port (default 8501)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slotsweep`` console script."""
    args = build_parser().parse_args(argv)
    handler = _HANDLERS[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("slotsweep: interrupted; resume with `slotsweep resume`", file=sys.stderr)
        return 130
    except Exception as exc:
        message = _usage_message(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return EXIT_USAGE


def _usage_message(exc: Exception) -> str | None:
    """The one-line (or one line per problem) text of a user mistake, else None."""
    from searcher.config import ConfigError
    from searcher.experiments import UsageError
    from trials.scheduler import ClusterConfigError, UnknownPool, Unschedulable

    if isinstance(exc, (ConfigError, ClusterConfigError)):
        return "\n".join(exc.problems)
    if isinstance(exc, (UsageError, Unschedulable, UnknownPool)):
        return str(exc).strip("'\"")
    return None


def _db_url(args: argparse.Namespace) -> str:
    """The database URL, checked for shape and reachability before any use."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from searcher.experiments import UsageError
    from storage import absolute_db_url, get_engine, redact_url, resolve_db_url

    url = resolve_db_url(args.db)
    source = "--db" if args.db else ("SLOTSWEEP_DB" if os.environ.get("SLOTSWEEP_DB") else "--db")
    try:
        parsed = sqlalchemy.engine.make_url(url)
        url = absolute_db_url(url)
        if parsed.get_backend_name() == "sqlite" and parsed.database:
            folder = Path(parsed.database).expanduser().resolve().parent
            if not folder.is_dir():
                raise UsageError(f"{source}: folder {folder} does not exist")
        with get_engine(url).connect():
            pass
    except (ArgumentError, NoSuchModuleError, ValueError):
        raise UsageError(
            f"{source}: not a database URL; use e.g. sqlite:///slotsweep.db or "
            "postgresql://user@host/db"
        ) from None
    except OperationalError as exc:
        reason = str(exc.orig).splitlines()[0] if exc.orig else "connection failed"
        raise UsageError(f"{source}: cannot open {redact_url(url)}: {reason}") from None
    return url


def _cluster(args: argparse.Namespace) -> Any:
    from trials.scheduler import load_cluster

    return load_cluster(args.cluster, slots=args.slots)


def _cmd_run(args: argparse.Namespace) -> int:
    from searcher import samplers
    from searcher.config import load_config
    from searcher.driver import SearchDriver
    from searcher.experiments import create_experiment
    from trials.scheduler import check_schedulable

    config_path = Path(args.config)
    config = load_config(config_path)
    cluster = _cluster(args)
    pool = cluster.pool(config.resources.resource_pool)
    for slots in config.possible_slots_per_trial():
        check_schedulable(pool, slots)
    db_url = _db_url(args)
    experiment_id = create_experiment(
        config,
        config_path=config_path,
        db_url=db_url,
        directions=samplers.study_directions(config),
    )
    console = Console(stderr=True)
    console.print(f"experiment {experiment_id} ({config.name}) created")
    if args.detach:
        return 0
    driver = SearchDriver(
        experiment_id, db_url=db_url, cluster=cluster, show_progress=not args.no_progress
    )
    state = driver.run()
    _print_summary(db_url, experiment_id, state.value)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    from searcher.driver import SearchDriver
    from searcher.experiments import find_experiment
    from storage import session_scope

    db_url = _db_url(args)
    with session_scope(db_url) as session:
        experiment_id = find_experiment(session, args.experiment).id
    driver = SearchDriver(
        experiment_id,
        db_url=db_url,
        cluster=_cluster(args),
        show_progress=not args.no_progress,
    )
    state = driver.run()
    _print_summary(db_url, experiment_id, state.value)
    return 0


def _print_summary(db_url: str, experiment_id: int, state: str) -> None:
    from searcher.experiments import best_trials, trial_counts
    from searcher.progress import best_trials_table
    from storage import Experiment, session_scope

    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        counts = trial_counts(session, experiment_id)
        best = best_trials(session, experiment)
        metric = experiment.config["searcher"]["metric"]
        console = Console()
        console.print(
            f"experiment {experiment_id} {state}: {counts.completed} completed, "
            f"{counts.pruned} pruned, {counts.errored} failed, {counts.queued} queued"
        )
        if best:
            console.print(best_trials_table(best, metric))


def _cmd_list(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from searcher.experiments import best_trials, trial_counts
    from storage import Experiment, session_scope, upgrade_schema

    db_url = _db_url(args)
    upgrade_schema(db_url)
    table = Table(title="Experiments")
    for column in (
        "id",
        "name",
        "state",
        "trials",
        "running",
        "completed",
        "pruned",
        "failed",
        "best",
    ):
        table.add_column(column)
    with session_scope(db_url) as session:
        for experiment in session.scalars(select(Experiment).order_by(Experiment.id)):
            counts = trial_counts(session, experiment.id)
            best = best_trials(session, experiment, limit=1)
            best_text = f"{best[0].searcher_metric_value:.6g}" if best else "-"
            table.add_row(
                str(experiment.id),
                experiment.name,
                experiment.state.value,
                f"{counts.total}/{experiment.max_trials}",
                str(counts.running),
                str(counts.completed),
                str(counts.pruned),
                str(counts.errored),
                best_text,
            )
    Console(width=200).print(table)
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    from sqlalchemy import func, select

    from searcher.experiments import find_experiment
    from storage import Checkpoint, CheckpointState, Trial, session_scope, upgrade_schema

    db_url = _db_url(args)
    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        experiment = find_experiment(session, args.experiment)
        metric = experiment.config["searcher"]["metric"]
        table = Table(
            title=f"Experiment {experiment.id}: {experiment.name} ({experiment.state.value})"
        )
        for column in (
            "trial",
            "state",
            metric,
            "batches",
            "restarts",
            "checkpoint",
            "hyperparameters",
        ):
            table.add_column(column)
        latest = (
            select(Checkpoint.trial_id, func.max(Checkpoint.step).label("step"))
            .where(Checkpoint.state == CheckpointState.COMPLETED)
            .group_by(Checkpoint.trial_id)
            .subquery()
        )
        rows = session.execute(
            select(Trial, latest.c.step)
            .outerjoin(latest, latest.c.trial_id == Trial.id)
            .where(Trial.experiment_id == experiment.id)
            .order_by(Trial.id)
        ).all()
        for trial, checkpoint_step in rows:
            value = trial.searcher_metric_value
            table.add_row(
                str(trial.id),
                trial.state.value,
                "-" if value is None else f"{value:.6g}",
                str(trial.total_batches),
                str(trial.restarts),
                "-" if checkpoint_step is None else f"step {checkpoint_step}",
                ", ".join(f"{k}={v}" for k, v in sorted(trial.hparams.items())),
            )
    Console(width=220).print(table)
    return 0


def _cmd_pause(args: argparse.Namespace) -> int:
    from searcher.experiments import request_action

    experiment = request_action(_db_url(args), args.experiment, "pause")
    print(f"experiment {experiment.id}: pause requested")
    return 0


def _cmd_kill(args: argparse.Namespace) -> int:
    from searcher.experiments import request_action

    experiment = request_action(_db_url(args), args.experiment, "kill")
    print(f"experiment {experiment.id}: kill requested")
    return 0


def _cmd_enqueue(args: argparse.Namespace) -> int:
    import optuna

    from searcher import space
    from searcher.config import ExperimentConfig
    from searcher.experiments import UsageError, find_experiment
    from storage import Experiment, ExperimentState, optuna_storage, session_scope

    db_url = _db_url(args)
    with session_scope(db_url) as session:
        experiment = find_experiment(session, args.experiment)
        config = ExperimentConfig.model_validate(experiment.config)
        study_name = experiment.study_name
        if experiment.state.is_terminal:
            raise UsageError(
                f"experiment: '{experiment.name}' (id {experiment.id}) is "
                f"{experiment.state.value}; trials can be added to running or paused experiments"
            )
    try:
        params = space.parse_enqueue_params(config.hyperparameters, list(args.params))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=optuna_storage(db_url))
    study.enqueue_trial(params, skip_if_exists=False)
    with session_scope(db_url) as session:
        refreshed = session.get(Experiment, experiment.id)
        state = refreshed.state if refreshed else ExperimentState.PAUSED
    print(f"experiment {experiment.id}: trial enqueued ({state.value})")
    return 0


def _cmd_task(args: argparse.Namespace) -> int:
    from storage import session_scope, upgrade_schema
    from trials import allocations

    db_url = _db_url(args)
    upgrade_schema(db_url)
    cluster = _cluster(args)
    table = Table(title="Tasks")
    for column in ("pool", "agent", "host", "slot", "experiment", "trial"):
        table.add_column(column)
    with session_scope(db_url) as session:
        for row in allocations.holders(session, cluster):
            table.add_row(
                row.pool,
                row.agent,
                row.host,
                str(row.slot),
                "-" if row.experiment_id is None else str(row.experiment_id),
                "-" if row.trial_id is None else str(row.trial_id),
            )
    Console(width=200).print(table)
    return 0


def _cmd_agents(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    table = Table(title="Agents")
    for column in ("pool", "agent", "host", "slots", "heterogeneous fits", "fitting policy"):
        table.add_column(column)
    for pool in cluster.pools:
        for agent in pool.agents:
            table.add_row(
                pool.name,
                agent.name,
                agent.host,
                ",".join(str(s) for s in agent.slots),
                str(pool.allowing_heterogeneous_fits).lower(),
                pool.fitting_policy,
            )
    Console(width=200).print(table)
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    import ui

    return ui.launch(_db_url(args), host=args.host, port=args.port)


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "activate": _cmd_resume,
    "list": _cmd_list,
    "describe": _cmd_describe,
    "pause": _cmd_pause,
    "kill": _cmd_kill,
    "enqueue": _cmd_enqueue,
    "task": _cmd_task,
    "agents": _cmd_agents,
    "ui": _cmd_ui,
}


if __name__ == "__main__":
    raise SystemExit(main())
