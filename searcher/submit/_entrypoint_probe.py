"""Resolve an entrypoint in a process of its own: ``python -m searcher.submit._entrypoint_probe DIR EP``.

Run by :func:`searcher.submit.preflight.check_entrypoint`, never imported by the driver: the
user's module is imported here, with whatever it does at import time (reading data,
raising, exiting), and only a one-line verdict goes back. The resolution itself is the
ranks' (:func:`trials.entrypoints.load_entrypoint`), so the check and the ranks agree on
what resolves, and it imports no more than the user's module does (no torch for a
trial that does not use it).

The verdict is the last stdout line that starts with :data:`MARKER`, followed by JSON:
``null`` when the entrypoint resolves, else the problem as one line naming the field.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import traceback

MARKER = "slotsweep-entrypoint-check:"


def resolve(model_dir: str, entrypoint: str) -> str | None:
    """The problem with ``entrypoint`` in ``model_dir`` (imports it); ``None`` if it resolves."""
    from trials.entrypoints import InvalidTrialError, load_entrypoint

    module_name, _, attr = entrypoint.partition(":")
    try:
        load_entrypoint(entrypoint, model_dir)
    except InvalidTrialError as error:
        return str(error) + _did_you_mean(module_name, attr)
    except BaseException as error:  # the user's module raised (or exited) while importing
        return (
            f"entrypoint: importing {module_name!r} failed: {type(error).__name__}: "
            f"{_first_line(error)}{_where(error, model_dir)}"
        )
    return None


def _did_you_mean(module_name: str, attr: str) -> str:
    module = sys.modules.get(module_name)
    if module is None or hasattr(module, attr):
        return ""
    names = [name for name in dir(module) if not name.startswith("_")]
    close = difflib.get_close_matches(attr, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _where(error: BaseException, model_dir: str) -> str:
    """`` (model.py line 3)``: the innermost frame in the user's files, else the innermost."""
    frames = traceback.extract_tb(error.__traceback__)
    root = os.path.realpath(model_dir) + os.sep
    mine = [f for f in frames if os.path.realpath(f.filename).startswith(root)]
    if not frames:
        return ""
    frame = (mine or frames)[-1]
    name = os.path.relpath(frame.filename, model_dir) if mine else frame.filename
    return f" ({name} line {frame.lineno})"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(
            "usage: python -m searcher.submit._entrypoint_probe MODEL_DIR ENTRYPOINT",
            file=sys.stderr,
        )
        return 2
    problem = resolve(argv[0], argv[1])
    sys.stdout.flush()
    # On a line of its own, after whatever the user's module printed.
    print(f"\n{MARKER}{json.dumps(problem)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
