"""The UI's only writes: a confirmed pause, activate, kill or resume of an experiment, and who may.

The request takes the one path ``slotsweep pause|kill`` also takes
(:func:`trials.coordination.control.request_action`): a running experiment's driver is asked
through ``Experiment.requested_action``; one with no driver is changed directly.

The UI has no login. Served on a loopback address only this machine's users reach
it, so anyone who sees the page may act. Served on any other address, ``slotsweep
ui`` makes a random token, hands it to the server in :data:`TOKEN_ENV_VAR` (never on
the command line, which ``ps`` shows to every user) and prints the address to open
with ``?token=...``; the controls appear only on pages opened with that token.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from storage import DB_ENV_VAR, Experiment, ExperimentState, get_engine, session_scope
from trials.coordination import control

# Keyed by the actions' values: the page's radio shows and returns plain text.
ACTIONS = {
    control.Action.PAUSE.value: (
        "Pause: start no new trials; running trials stop at their next checkpoint."
    ),
    control.Action.KILL.value: "Kill: stop every running trial now and end the experiment.",
    control.Action.ACTIVATE.value: (
        "Activate: withdraw a pending pause, or say how to run a paused experiment."
    ),
}
# Not a request to a driver: the UI starts one (``slotsweep resume``), see start_resume.
RESUME = "resume"
RESUME_TEXT = "Resume: start a driver for this experiment, as `slotsweep resume` would."
TOKEN_ENV_VAR = "SLOTSWEEP_UI_TOKEN"
TOKEN_QUERY_PARAM = "token"


def new_token() -> str:
    """A fresh random token for the control actions (192 bits, URL-safe)."""
    return secrets.token_urlsafe(24)


def token_accepted(expected: str | None, given: str | None) -> bool:
    """Whether a page that presents ``given`` may pause or kill, when ``expected`` is set.

    No expected token (a loopback server) lets everyone act; otherwise the two must
    match, compared in constant time so response timing does not reveal a prefix.

    Example:
        >>> token_accepted(None, None), token_accepted("abc", "abc"), token_accepted("abc", "ab")
        (True, True, False)
    """
    if not expected:
        return True
    if given is None:
        return False
    return secrets.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def request_action(url: str, experiment_id: int, action: str) -> str:
    """Pause, activate or kill an experiment; returns what happened, in words.

    The same path ``slotsweep pause|kill`` takes (:func:`trials.coordination.control.request_action`),
    so a request is honoured in every state (a running experiment's driver is asked;
    one with no driver is changed directly); a refusal (an ended experiment) is shown
    as its reason.

    Example:
        >>> request_action(url, 1, "pause")
        'Experiment 1 paused (no driver was running); `slotsweep resume 1` continues it.'
        >>> request_action(url, 1, "pause")
        'Experiment 1 is already PAUSED; `slotsweep resume 1` continues it.'
    """
    try:
        return control.request_action(url, experiment_id, action)
    except control.ActionRefused as exc:
        return str(exc)


def resumable(url: str, experiment_id: int) -> bool:
    """Whether ``slotsweep resume`` would run the experiment now: PAUSED, or ACTIVE with
    no live driver (created with ``--detach``, or its driver died)."""
    # Read-only, like every page: the read-write engine checks the schema first, which
    # takes SQLite's write lock while a search is writing.
    with session_scope(get_engine(url, read_only=True)) as session:
        experiment = session.get(Experiment, experiment_id)
        if experiment is None:
            return False
        if experiment.state == ExperimentState.PAUSED:
            return True
        return experiment.state == ExperimentState.ACTIVE and not control.driver_alive(experiment)


def resume_log_path(experiment_id: int) -> Path:
    """Where the output of a driver the UI started goes (the UI has no terminal)."""
    return Path(tempfile.gettempdir()) / f"slotsweep-resume-{experiment_id}.log"


def resume_command(experiment_id: int) -> list[str]:
    """``slotsweep resume ID`` as an argument list, run by this Python (never a shell).

    Example:
        >>> resume_command(3)[1:]
        ['-m', 'searcher.cli', 'resume', '3', '--no-progress']
    """
    return [sys.executable, "-m", "searcher.cli", "resume", str(experiment_id), "--no-progress"]


def start_resume(url: str, experiment_id: int) -> str:
    """Start a driver for the experiment, as ``slotsweep resume`` in a terminal would.

    The driver runs detached (its own session, no terminal): it outlives this page and
    the UI server. The database URL travels in ``$SLOTSWEEP_DB``, never on the command
    line, which ``ps`` shows to every user. Returns what happened, in words.
    """
    if not resumable(url, experiment_id):
        return f"Experiment {experiment_id} has a running driver or has ended: not started."
    log = resume_log_path(experiment_id)
    with open(log, "ab") as output:
        process = subprocess.Popen(
            resume_command(experiment_id),
            env={**os.environ, DB_ENV_VAR: url},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return (
        f"Started `slotsweep resume {experiment_id}` (pid {process.pid}); its output goes "
        f"to `{log}`. The page shows the driver once it records its heartbeat."
    )
