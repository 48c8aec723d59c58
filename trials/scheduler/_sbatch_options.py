"""The cluster file's ``slurm.sbatch_options``, read the way ``sbatch`` reads its arguments.

The Slurm job executor puts a user's options on each job's ``sbatch`` line before its
own (:func:`trials.executors._slurm_commands.sbatch_argv`), so its own come last and win.
That holds only if no user option can reach them or the job's shape: sbatch parses its
arguments with ``getopt_long``, which takes a long option abbreviated (``--part`` is
``--partition``), a short one glued to its value (``-pgpu``) or in a cluster
(``-vpgpu``), and a value from the next argument (``-p``, ``gpu``) -- even when that
argument is one of ours, so an option left without its value at the end of the user's
list would swallow our first. :func:`sbatch_option_problems` walks the list as
``getopt_long`` does and refuses, in every spelling:

- the options slotsweep sets for every job (:data:`MANAGED_SBATCH_OPTIONS`), and those
  that would keep it from following the job it submitted (:data:`UNFOLLOWABLE_SBATCH_OPTIONS`);
- anything sbatch would take as the batch script or its arguments (a bare word, ``--``)
  or as a heterogeneous job's separator (``:``): the script comes on stdin;
- an option that needs a value and has none, a value given to an option that takes
  none, and an abbreviation that sbatch could not resolve.

Options sbatch does not list here (a site's SPANK plugin adds some) pass as written;
their value goes after ``=``, since only sbatch knows whether they take the next item.

Example:
    >>> sbatch_option_problems(["--mem", "64G", "--signal=TERM@120", "-pother", "--out=x"])
    {3: "-p (--partition) is set by slotsweep for every job; use the slurm block's own fields (partition, account, time_limit, qos, constraint) or leave it out", 4: "--out (--output) is set by slotsweep for every job; use the slurm block's own fields (partition, account, time_limit, qos, constraint) or leave it out"}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple


def _words(text: str) -> frozenset[str]:
    """The names in ``text``, one or more per line: long lists of names stay readable."""
    return frozenset(text.split())


# sbatch's options as Slurm's src/common/slurm_opt.c declares them (the entries sbatch
# takes), by what follows them. Older Slurm versions know fewer; an option one version
# reads with an optional value and another with none counts as optional here.
_TAKES_VALUE = _words(
    """
    account acctg-freq array autocomplete batch bb bbf begin chdir cluster
    cluster-constraint clusters comment constraint container container-id context
    core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
    dependency distribution error exclude export export-file extra extra-node-info gid
    gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags
    hint input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem
    mem-bind mem-per-cpu mem-per-gpu mem-update mincpus network nodefile nodelist nodes
    ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
    ntasks-per-tres open-mode output partition prefer priority profile qos reservation
    resources runtime segment signal sockets-per-node switches tasks-per-node
    thread-spec threads-per-core time time-min tmp tres-bind tres-per-task uid
    wait-all-nodes wckey wrap
    """
)
# A value only glued to the option (``--requeue=1``, ``-k1``), never the next item.
_MAY_TAKE_VALUE = _words(
    """
    exclusive get-user-env nice no-kill oom-kill-step propagate requeue resv-ports
    """
)
_TAKES_NO_VALUE = _words(
    """
    consolidate-segments contiguous external help hold ignore-pbs no-requeue overcommit
    oversubscribe parsable quiet reboot spread-job spread-segments stepmgr test-only
    usage use-min-nodes verbose version wait
    """
)
_LONG_OPTIONS = _TAKES_VALUE | _MAY_TAKE_VALUE | _TAKES_NO_VALUE
#: sbatch's one-letter options and the long option each one is.
SHORT_SBATCH_OPTIONS = {
    "A": "account",
    "a": "array",
    "B": "extra-node-info",
    "b": "begin",
    "C": "constraint",
    "c": "cpus-per-task",
    "D": "chdir",
    "d": "dependency",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "h": "help",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "M": "clusters",
    "m": "distribution",
    "N": "nodes",
    "n": "ntasks",
    "O": "overcommit",
    "o": "output",
    "p": "partition",
    "Q": "quiet",
    "q": "qos",
    "S": "core-spec",
    "s": "oversubscribe",
    "t": "time",
    "V": "version",
    "v": "verbose",
    "W": "wait",
    "w": "nodelist",
    "x": "exclude",
}

#: What slotsweep sets on every job's sbatch line (every option ``sbatch_argv`` writes),
#: and the options that would contradict it: another way to ask for nodes, tasks, CPUs
#: or GPUs than the shape the scheduler chose, another log file, working directory,
#: script or requeue policy.
MANAGED_SBATCH_OPTIONS = _words(
    """
    account chdir constraint cpus-per-gpu cpus-per-task error exclusive export gpus
    gpus-per-node gpus-per-socket gpus-per-task gres job-name no-requeue nodes ntasks
    ntasks-per-gpu ntasks-per-node ntasks-per-tres open-mode output parsable partition
    qos requeue tasks-per-node time tres-per-task wrap
    """
)
#: Options after which slotsweep could not follow its job: sbatch would print no job id
#: (``--quiet``, ``--test-only``, ``--help``, ``--usage``, ``--version``), not return
#: until the job ends (``--wait``), submit it to another cluster than ``squeue`` and
#: ``scancel`` ask (``--clusters``), or run the trial as many jobs (``--array``).
UNFOLLOWABLE_SBATCH_OPTIONS = _words(
    """
    array cluster clusters help quiet test-only usage version wait
    """
)
_MANAGED_MESSAGE = (
    "is set by slotsweep for every job; use the slurm block's own fields "
    "(partition, account, time_limit, qos, constraint) or leave it out"
)
_SPLIT_NAME = re.compile(r"[=\s]")


class _Reading(NamedTuple):
    """What one item of the list is, as sbatch reads it."""

    problem: str | None = None
    #: The spelling of an option whose value is the next item (``-p``, ``--mem``).
    waiting: str | None = None
    #: The spelling of an option sbatch does not list here, written without ``=``:
    #: whether it takes the next item as its value only sbatch knows.
    unlisted: str | None = None


def sbatch_option_problems(options: Sequence[str]) -> dict[int, str]:
    """Why items of ``options`` cannot go on slotsweep's ``sbatch`` line, by their index.

    ``options`` are argv items as the cluster file lists them; a problem is put where
    its option starts (``-p`` of ``["-p", "other"]``). See the module docstring.

    Example:
        >>> sbatch_option_problems(["--part=x", "--mem"])[0].split(";")[0]
        '--part (--partition) is set by slotsweep for every job'
        >>> sbatch_option_problems(["--mem"])
        {0: "--mem needs a value, in the same item or the next; sbatch would take slotsweep's first option as it"}
    """
    problems: dict[int, str] = {}
    previous = _Reading()
    open_at = 0  # Where the last option that may still take a value starts.
    for index, item in enumerate(options):
        if item == ":":
            # sbatch splits its arguments at every ':' before it reads any option.
            reading = _Reading(
                "':' separates the components of a heterogeneous job; slotsweep submits "
                "one job per trial"
            )
        elif any(c in item for c in "\n\r\0"):
            reading = _Reading("an option may not hold line breaks or NUL characters")
        elif previous.waiting is not None:
            reading = _Reading()  # The value of the option before it, whatever it looks like.
        elif item == "--":
            reading = _Reading(
                "'--' ends sbatch's options: what follows would be taken as the batch script"
            )
        elif item.startswith("--"):
            reading = _long_option(item)
        elif item.startswith("-") and item != "-":
            reading = _short_options(item)
        else:
            value_of = (
                f" (if it is the value of {previous.unlisted}, write {previous.unlisted}={item})"
                if previous.unlisted
                else ""
            )
            reading = _Reading(
                f"{item!r} is not an sbatch option (like --mem=64G); sbatch would take it as "
                f"the batch script{value_of}"
            )
        if reading.problem:
            problems[index] = reading.problem
        if reading.waiting or reading.unlisted:
            open_at = index
        previous = reading
    if previous.waiting and open_at not in problems:
        problems[open_at] = (
            f"{previous.waiting} needs a value, in the same item or the next; sbatch would "
            "take slotsweep's first option as it"
        )
    elif previous.unlisted:
        problems[open_at] = (
            f"{previous.unlisted} is not an option sbatch lists; write its value as "
            f"{previous.unlisted}=VALUE, or, if it takes none, put it before another option "
            "(sbatch could take slotsweep's first option as its value)"
        )
    return problems


def _long_option(item: str) -> _Reading:
    """One ``--name[=value]``; ``name`` may be an abbreviation, as getopt_long allows."""
    written = _SPLIT_NAME.split(item[2:], maxsplit=1)[0]
    if not written:
        return _Reading(f"{item!r} is not an sbatch option (like --mem=64G)")
    spelled = f"--{written}"
    has_value = len(item) > len(spelled)
    matches = _long_matches(written)
    if len(matches) > 1:
        return _Reading(
            f"{spelled} abbreviates several sbatch options ({', '.join(matches)}); write "
            "the option out in full"
        )
    name = matches[0] if matches else None
    # A refused option still takes its value from the next item, as sbatch would: that
    # item is no second problem.
    waiting = spelled if name in _TAKES_VALUE and not has_value else None
    problem = _forbidden(spelled, name) if name else None
    if problem:
        return _Reading(problem, waiting=waiting)
    if has_value and item[len(spelled)] != "=":
        # sbatch would read the whole item as the option's name, and know none such.
        return _Reading(f"{item!r}: give one option per item, its value after '=' or next")
    if name is None:
        return _Reading(unlisted=None if has_value else spelled)
    if has_value and name in _TAKES_NO_VALUE:
        return _Reading(f"--{name} takes no value")
    return _Reading(waiting=waiting)


def _short_options(item: str) -> _Reading:
    """One ``-x``, ``-xVALUE`` or cluster of letters (``-vx``), as getopt reads them."""
    for position, letter in enumerate(item[1:], start=1):
        name = SHORT_SBATCH_OPTIONS.get(letter)
        if name is None:
            where = f" (in {item!r})" if len(item) > 2 else ""
            return _Reading(f"-{letter} is not an sbatch option{where}")
        # The rest of the item is the value of a letter that takes one; with none left,
        # the next item is (a refused letter's too, as sbatch would read it).
        waiting = f"-{letter}" if name in _TAKES_VALUE and position + 1 == len(item) else None
        problem = _forbidden(f"-{letter}", name)
        if problem or name in _TAKES_VALUE or name in _MAY_TAKE_VALUE:
            return _Reading(problem, waiting=waiting)
    return _Reading()


def _long_matches(written: str) -> list[str]:
    """The sbatch long options ``--written`` stands for: itself, or those it abbreviates.

    ``getopt_long`` takes an exact name first, else a prefix of exactly one name.
    """
    if written in _LONG_OPTIONS:
        return [written]
    return sorted(name for name in _LONG_OPTIONS if name.startswith(written))


def _forbidden(spelled: str, name: str) -> str | None:
    """Why option ``name`` (written ``spelled``) may not be passed, or None."""
    shown = spelled if spelled == f"--{name}" else f"{spelled} (--{name})"
    if name in MANAGED_SBATCH_OPTIONS:
        return f"{shown} {_MANAGED_MESSAGE}"
    if name in UNFOLLOWABLE_SBATCH_OPTIONS:
        return f"{shown} would keep slotsweep from following the job it submits; leave it out"
    return None
