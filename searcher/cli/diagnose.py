"""The ``slotsweep diagnose`` command: its arguments and exit codes (the work is
:mod:`searcher.diagnose.probes`, imported when the command runs: building the parser stays cheap).

Example:
    $ slotsweep diagnose examples/digits/experiment.yaml --hparams global_batch_size=256
    $ slotsweep diagnose experiment.yaml --slots 2 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

AddOptions = Callable[[argparse.ArgumentParser], None]


def add_parser(commands: Any, options: tuple[AddOptions, ...]) -> None:
    """Register ``diagnose`` on the CLI's sub-parsers; ``options`` add --db, --cluster, --json."""
    parser = commands.add_parser(
        "diagnose", help="measure where a trial's step time goes and what to change"
    )
    parser.add_argument("config", metavar="CONFIG", help="experiment YAML file")
    parser.add_argument(
        "--hparams",
        metavar="KEY=VALUE",
        nargs="+",
        default=[],
        help="the point of the space to probe (default: the first point)",
    )
    parser.add_argument(
        "--probes",
        metavar="NAME",
        nargs="+",
        default=[],
        help="run only these of the optional probes (synthetic, no_exchange, one_slot, "
        "one_agent, buckets, compression); configured always runs (name it to run only it), "
        "compression only when the others find the trial communication-bound",
    )
    parser.add_argument(
        "--batches",
        metavar="N",
        type=int,
        help="batches per throughput probe, timed in windows of 10, the first left out as "
        "warm-up (default 60, at least 40); more give a narrower spread",
    )
    for add in options:
        add(parser)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """0 with a diagnosis, 1 when a probe failed (its trial's error in one line); bad
    input and unplaceable sizes raise what the CLI turns into one line and exit 2."""
    from searcher.diagnose.probes import PROBE_BATCHES, ProbeFailed, diagnose, print_report

    try:
        report = diagnose(
            Path(args.config),
            hparams=args.hparams,
            only=args.probes,
            batches=PROBE_BATCHES if args.batches is None else args.batches,
            cluster=args.cluster,
            slots=args.slots,
            db=args.db,
        )
    except ProbeFailed as exc:
        print(f"slotsweep diagnose: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print_report(report, Console())
    return 0
