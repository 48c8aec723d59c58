"""The ``slotsweep`` command line.

Every user mistake prints one line naming the argument or field and what is allowed,
exits with code 2 and writes nothing.

Example:
    $ slotsweep run examples/digits/experiment.yaml
    $ slotsweep list
    $ slotsweep describe 3 --json
    $ slotsweep continue 3 --more-trials 8
    $ slotsweep tensorboard 3
    $ slotsweep export mlflow 3 --tracking-uri http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console

import searcher.cli.exports as exports
from searcher.cli.diagnose import add_parser as add_diagnose_parser
from searcher.cli.diagnose import cmd_diagnose

if TYPE_CHECKING:
    from searcher.api import Experiment

EXIT_USAGE = 2
# A file of 100,000 unknown keys must not print 100,000 lines: the first problems suffice.
MAX_PROBLEMS_SHOWN = 50
# TCP's port range.
_MAX_PORT = 65535


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
        type=_int_in("--slots", 1, _max_slots_per_agent),
        default=None,
        help="slots of the local agent (default: GPUs, or CPU cores without GPUs)",
    )


def _add_relocate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--relocate",
        metavar="OLD=NEW",
        action="append",
        default=[],
        help="read the experiment's stored folders under OLD (model, checkpoints, logs) as "
        "under NEW, e.g. for a database copied elsewhere; may be repeated",
    )


def _max_slots_per_agent() -> int:
    # Imported when --slots is given, not whenever the parser is built (pydantic is slow).
    from trials.scheduler import MAX_SLOTS_PER_AGENT

    return MAX_SLOTS_PER_AGENT


def _int_in(name: str, low: int, high: int | Callable[[], int]) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``[low, high]`` (``high`` may be computed)."""

    def parse(text: str) -> int:
        top = high() if callable(high) else high
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= top:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer from {low} to {top}, got {text!r}"
            )
        return value

    return parse


def _max_trials_limit() -> int:
    # Imported when the option is given, not whenever the parser is built (pydantic is slow).
    from trials.config import MAX_TRIALS

    return MAX_TRIALS


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print JSON (full precision) instead of a table"
    )


def _add_experiment(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "experiment", metavar="EXPERIMENT", help="experiment id, or a name only one experiment has"
    )


def _add_search_commands(commands: Any) -> None:
    """``run``, ``resume`` (and its alias ``activate``) and ``continue``: what runs a search."""
    run = commands.add_parser("run", help="validate an experiment config and run its search")
    run.add_argument("config", metavar="CONFIG", help="experiment YAML file")
    _add_db(run)
    _add_cluster(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument(
        "--detach", action="store_true", help="create the experiment and exit without running it"
    )
    mode.add_argument(
        "--test",
        action="store_true",
        help="run one trial briefly (a few batches, a validation, a checkpoint save and "
        "restore) and record nothing",
    )

    for name, text in (
        ("resume", "continue an experiment from the database"),
        ("activate", "alias of resume"),
    ):
        resume = commands.add_parser(name, help=text)
        _add_experiment(resume)
        _add_db(resume)
        _add_cluster(resume)
        _add_relocate(resume)
        resume.add_argument("--no-progress", action="store_true", help="no progress bar")

    extend = commands.add_parser(
        "continue", help="give a COMPLETED or PAUSED search more trials in the same study"
    )
    _add_experiment(extend)
    budget = extend.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--max-trials",
        metavar="N",
        type=_int_in("--max-trials", 1, _max_trials_limit),
        help="the new total number of trials",
    )
    budget.add_argument(
        "--more-trials",
        metavar="K",
        type=_int_in("--more-trials", 1, _max_trials_limit),
        help="trials to add to the budget",
    )
    _add_db(extend)
    _add_cluster(extend)
    _add_relocate(extend)
    extend.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="slotsweep", description="Hyperparameter search over distributed trials."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    _add_search_commands(commands)

    listing = commands.add_parser("list", help="experiments with state, trial counts, best value")
    _add_db(listing)
    _add_json(listing)

    describe = commands.add_parser("describe", help="an experiment's trials")
    _add_experiment(describe)
    _add_db(describe)
    _add_json(describe)

    for name, text in (
        ("pause", "ask a running experiment to checkpoint its trials and pause"),
        ("kill", "stop an experiment now and cancel it"),
    ):
        control = commands.add_parser(name, help=text)
        _add_experiment(control)
        _add_db(control)

    enqueue = commands.add_parser("enqueue", help="add a trial with given hyperparameters")
    _add_experiment(enqueue)
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
    _add_json(task_list)

    agents = commands.add_parser("agents", help="agents and resource pools")
    _add_db(agents)
    _add_cluster(agents)

    add_diagnose_parser(commands, (_add_db, _add_cluster, _add_json))

    ui = commands.add_parser("ui", help="start the web UI")
    _add_db(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument(
        "--port", type=_int_in("--port", 1, _MAX_PORT), default=8501, help="port (default 8501)"
    )
    exports.add_commands(
        commands,
        add_db=_add_db,
        add_experiment=_add_experiment,
        port=_int_in("--port", 1, _MAX_PORT),
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slotsweep`` console script."""
    from trials.timings import timings_from_env

    args = build_parser().parse_args(argv)
    handler = _HANDLERS[args.command]
    try:
        # Every command may judge a driver's liveness: a malformed value stops here.
        timings_from_env()
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
    from searcher.experiments import UsageError
    from storage import DatabaseUrlError
    from trials.config import ConfigError
    from trials.scheduler import ClusterConfigError, UnknownPool, Unschedulable
    from trials.timings import TimingsError

    if isinstance(exc, (ConfigError, ClusterConfigError)):
        return "\n".join(_capped(exc.problems))
    if isinstance(exc, DatabaseUrlError):
        return str(exc)  # It may end in a quote (the pip command); nothing to strip.
    if isinstance(exc, UnknownPool):
        return str(exc)  # its own __str__: the name and the pools there are
    if isinstance(exc, (UsageError, Unschedulable, TimingsError)):
        return str(exc)
    return None


def _capped(problems: list[str]) -> list[str]:
    """The first :data:`MAX_PROBLEMS_SHOWN` problems, then how many more there are."""
    if len(problems) <= MAX_PROBLEMS_SHOWN:
        return problems
    more = len(problems) - MAX_PROBLEMS_SHOWN
    return [*problems[:MAX_PROBLEMS_SHOWN], f"and {more} more problem{'s' if more > 1 else ''}"]


def _db_url(args: argparse.Namespace, *, need_schema: bool = False) -> str:
    """The ``--db`` database, checked and opened (:func:`searcher.submit.submission.open_database`)."""
    from searcher.submit.submission import open_database

    return open_database(args.db, need_schema=need_schema)


def _cluster(args: argparse.Namespace) -> Any:
    from trials.executors import load_cluster

    return load_cluster(args.cluster, slots=args.slots)


def _console() -> Console:
    # Rich takes the terminal's width (COLUMNS, else 80 when not a terminal).
    return Console()


def _print_json(data: object) -> None:
    # Floats keep every digit; datetimes and other non-JSON values as text.
    print(json.dumps(data, indent=2, default=str))


def _cmd_run(args: argparse.Namespace) -> int:
    import searcher.api as api

    config_path = Path(args.config)
    if args.test:
        from searcher.diagnose.smoke import run_trial_test

        return run_trial_test(config_path, cluster=args.cluster, slots=args.slots)
    if args.detach:
        api.submit(config_path, db=args.db, cluster=args.cluster, slots=args.slots)
        return 0
    experiment = api.run(
        config_path,
        db=args.db,
        cluster=args.cluster,
        slots=args.slots,
        progress=not args.no_progress,
    )
    return _summary(experiment)


def _cmd_resume(args: argparse.Namespace) -> int:
    import searcher.api as api

    experiment = api.resume(
        args.experiment,
        db=args.db,
        cluster=args.cluster,
        slots=args.slots,
        relocate=args.relocate,
        progress=not args.no_progress,
    )
    return _summary(experiment)


def _cmd_continue(args: argparse.Namespace) -> int:
    import searcher.api as api

    experiment = api.continue_search(
        args.experiment,
        max_trials=args.max_trials,
        more_trials=args.more_trials,
        db=args.db,
        cluster=args.cluster,
        slots=args.slots,
        relocate=args.relocate,
        progress=not args.no_progress,
    )
    return _summary(experiment)


def _summary(experiment: Experiment) -> int:
    """Print how the search ended; exit code 1 when it ended ERROR, else 0."""
    from storage import ExperimentState

    state = experiment.state
    _print_summary(experiment.db_url, experiment.id, state.value)
    return 1 if state == ExperimentState.ERROR else 0


def _print_summary(db_url: str, experiment_id: int, state: str) -> None:
    """The final line (state and counts), a warning when some trials failed, the best trials."""
    from searcher.cli.tables import best_trials_table
    from storage import Experiment, session_scope
    from trials.config import read_stored_config
    from trials.queries import best_trials, trial_counts

    with session_scope(db_url) as session:
        experiment = session.get(Experiment, experiment_id)
        assert experiment is not None
        searcher = read_stored_config(experiment.config).searcher
        counts = trial_counts(session, experiment_id)
        best = best_trials(
            session, experiment_id, smaller_is_better=searcher.smaller_is_better, limit=5
        )
        metric = searcher.metric
        console = _console()
        console.print(
            f"experiment {experiment_id} {state}: {counts.completed} completed, "
            f"{counts.pruned} pruned, {counts.errored} failed, {counts.queued} queued"
            + (f", {counts.not_run} not run" if counts.not_run else ""),
            highlight=False,
        )
        if counts.errored and (counts.completed or counts.pruned):
            Console(stderr=True).print(
                f"warning: {counts.errored} of {counts.total} trials failed; "
                f"`slotsweep describe {experiment_id}` shows why",
                highlight=False,
            )
        if best:
            console.print(best_trials_table(best, metric))


def _cmd_list(args: argparse.Namespace) -> int:
    from searcher.cli.tables import experiment_rows, experiments_table
    from storage import session_scope, upgrade_schema

    db_url = _db_url(args, need_schema=True)
    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        rows = experiment_rows(session)
    if args.json:
        _print_json(rows)
    else:
        _console().print(experiments_table(rows))
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    from searcher.cli.tables import (
        describe_front,
        describe_rows,
        failure_lines,
        pareto_table,
        pruned_lines,
        skipped_checkpoint_lines,
        trials_table,
        waiting_lines,
    )
    from searcher.experiments import find_experiment
    from storage import session_scope, upgrade_schema

    db_url = _db_url(args, need_schema=True)
    upgrade_schema(db_url)
    with session_scope(db_url) as session:
        experiment = find_experiment(session, args.experiment)
        described = describe_rows(session, experiment)
        described.update(describe_front(db_url, experiment))
    if args.json:
        _print_json(described)
        return 0
    console = _console()
    console.print(trials_table(described))
    front = pareto_table(described)
    if front is not None:
        console.print(front)
    for line in [
        *pruned_lines(described),
        *failure_lines(described),
        *skipped_checkpoint_lines(described),
        *waiting_lines(described),
    ]:
        console.print(line, highlight=False, markup=False)
    return 0


def _cmd_pause(args: argparse.Namespace) -> int:
    from searcher.experiments import request_action
    from trials.coordination.control import Action

    print(request_action(_db_url(args, need_schema=True), args.experiment, Action.PAUSE))
    return 0


def _cmd_kill(args: argparse.Namespace) -> int:
    from searcher.experiments import request_action
    from trials.coordination.control import Action

    print(request_action(_db_url(args, need_schema=True), args.experiment, Action.KILL))
    return 0


def _cmd_enqueue(args: argparse.Namespace) -> int:
    import optuna

    import searcher.submit.space as space
    from searcher.experiments import UsageError, find_experiment
    from storage import Experiment, ExperimentState, optuna_storage, session_scope
    from trials.config import read_stored_config

    db_url = _db_url(args, need_schema=True)
    with session_scope(db_url) as session:
        experiment = find_experiment(session, args.experiment)
        config = read_stored_config(experiment.config)
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
    """Every slot and its holder, then the cluster's queue in order with each reason."""
    from searcher.cli.tables import queue_rows, queue_table, task_rows, tasks_table
    from storage import session_scope, upgrade_schema, utcnow
    from trials.queries import queue_views, slot_holders

    db_url = _db_url(args, need_schema=True)
    upgrade_schema(db_url)
    cluster = _cluster(args)
    with session_scope(db_url) as session:
        rows = task_rows(slot_holders(session, cluster))
        queue = queue_rows(queue_views(session), utcnow())
    if args.json:
        _print_json({"slots": rows, "queue": queue})
        return 0
    console = _console()
    console.print(tasks_table(rows))
    if queue:
        console.print(queue_table(queue))
    else:
        console.print("No trial is waiting for slots.", highlight=False)
    return 0


def _cmd_agents(args: argparse.Namespace) -> int:
    """Agents by pool; with a database, how much of each is held right now (shares too)."""
    from searcher.cli.tables import agents_table, shared_lines
    from searcher.experiments import UsageError
    from storage import DB_ENV_VAR, DatabaseUrlError, session_scope
    from trials.queries import SlotsInUse, slots_in_use

    cluster = _cluster(args)
    use: dict[tuple[str, str], SlotsInUse] | None = None
    try:
        db_url = _db_url(args, need_schema=True)
    except (UsageError, DatabaseUrlError):
        # The default database may not exist yet: agents need none. A database the
        # user named must open, though.
        if args.db or os.environ.get(DB_ENV_VAR):
            raise
    else:
        with session_scope(db_url) as session:
            use = slots_in_use(session)
    console = _console()
    console.print(agents_table(cluster, use))
    for line in shared_lines(use or {}):
        console.print(line, highlight=False)
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    """Check the database, then become ``python -m ui`` (this process, exec'd).

    The searcher never imports the UI (the README's dependency rule): the UI runs as
    its own program in this process's place, so the pid, the signals (Ctrl-C, ``kill``)
    and the exit code stay those of ``slotsweep ui``. The URL goes in the environment,
    never on a command line, where ``ps`` shows it to every user of the machine.
    """
    from storage import DB_ENV_VAR

    url = _db_url(args, need_schema=True)
    argv = [sys.executable, "-m", "ui", f"--host={args.host}", f"--port={args.port}"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, DB_ENV_VAR: url})


_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "diagnose": cmd_diagnose,
    "resume": _cmd_resume,
    "activate": _cmd_resume,
    "continue": _cmd_continue,
    "list": _cmd_list,
    "describe": _cmd_describe,
    "pause": _cmd_pause,
    "kill": _cmd_kill,
    "enqueue": _cmd_enqueue,
    "task": _cmd_task,
    "agents": _cmd_agents,
    "ui": _cmd_ui,
    **exports.HANDLERS,
}
