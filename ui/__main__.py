"""``python -m ui [--host HOST] [--port PORT]``: serve the UI (what ``slotsweep ui`` runs).

``slotsweep ui`` checks the database and then runs this program in its own place, so
that the ``searcher`` package never imports ``ui`` (the README's dependency rule: ``ui``
and ``searcher`` import ``trials`` and ``storage``, not each other).

The database URL comes from ``$SLOTSWEEP_DB`` only, never from the command line: any
user of the machine can read a process's argv (``ps``), while its environment is
readable by its owner only (see :mod:`ui._launch`). Without it the default applies
(``sqlite:///slotsweep.db``).

It serves until the server stops (so no example runs it here), then answers
Streamlit's exit code::

    main(["--host", "127.0.0.1", "--port", "8502"])
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ui._launch import launch

MAX_PORT = 65535
# Ctrl-C outside the server's wait: what ``slotsweep`` answers to any interrupted command.
INTERRUPTED_EXIT_CODE = 130
INTERRUPTED_MESSAGE = "slotsweep: interrupted; resume with `slotsweep resume`"


def _port(text: str) -> int:
    """A TCP port number, refused with the message ``slotsweep ui --port`` gives."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"--port must be an integer from 1 to {MAX_PORT}")
    return port


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``slotsweep ui`` except ``--db`` (the URL travels by environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m ui",
        description="Serve slotsweep's web UI for the database in $SLOTSWEEP_DB.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8501, help="port (default 8501)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the UI until the server stops; Streamlit's exit code."""
    args = build_parser().parse_args(argv)
    try:
        return launch(None, host=args.host, port=args.port)
    except KeyboardInterrupt:
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
