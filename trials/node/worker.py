"""The program every rank of a trial runs: ``torchrun ... -m trials.node.worker``.

The ``torchrun`` wrapper (:mod:`trials.node.torchrun`) forks its ranks from the agent,
which has imported torch already, and runs :func:`run_forked` in each; started as a
program of its own (plain ``torchrun``), a rank runs :func:`main`. Both behave alike.

The driver passes the trial's :class:`~trials.RuntimeSpec` as JSON in
``SLOTSWEEP_TRIAL_SPEC`` (the environment reaches every node of a launch, a file on
the driver's disk would not), without the database URL, which comes in
``SLOTSWEEP_DB_URL`` (command lines are where passwords leak), and points torchrun's
output at the trial's log file.

A rank never outlives its ``torchrun``: the first thing it does is ask the kernel for
SIGKILL when its parent dies (``PR_SET_PDEATHSIG``). Each rank runs in a session of
its own (torch's agent starts a program so; a forked rank takes one), so without this
a killed ``torchrun`` left its ranks training beside the trial's next attempt.

Next, before importing anything more, a rank routes its stdout and stderr (file
descriptors 1 and 2, so C-level output too) through a small child process that
prefixes every line with ``[rank N] `` (:mod:`trials.node._prefix`): the log of a multi-rank
trial can then be filtered per rank. It writes to the trial's log itself (named by
``SLOTSWEEP_LOG_TARGET``), not to the output it inherited: that is the ``torchrun``
wrapper's own ``[torchrun]`` prefixer (:mod:`trials.node.torchrun`).

Exit codes: 0 when the rank's part ended as planned (finished, pruned or preempted; the
outcome itself is in the database), 2 for a trial that cannot run as configured (one
line saying why), 3 when this attempt was superseded by a newer one (a driver ended it
and restarted the trial: it stops without recording anything), 4
(``storage.FENCED_EXIT_CODE``) when, checked before anything touches a device, the run
was already ended or its slot claim gone (its driver was stopped between recording the
run and starting it: the slots may be another trial's), 1 with one line and no
traceback when the database stayed unreachable or ``checkpoint_storage.path`` refused a
checkpoint, and 1 with a traceback for any other crash. That check
(:mod:`trials.node._fence`) is passed once per node by the ``torchrun`` wrapper before
it starts the ranks, which then skip it; a rank started otherwise checks for itself.

Before its first batch a rank imports what it needs and nothing more: the spec's
model (pydantic), torch and the runtime, with the garbage collector kept off them
(:mod:`trials.node._heap`). Neither ``storage`` nor SQLAlchemy nor a database driver
unless it checks the fence itself; rank 0 imports them in its recorder's thread.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import os
import sys
from typing import TYPE_CHECKING

from trials.node._fence import rank_fenced_start
from trials.node._heap import frozen_imports
from trials.node._prefix import run_prefixed, write_to_log_target
from trials.node.exiting import exit_without_teardown, run_exit_handlers

if TYPE_CHECKING:
    from trials.config import RuntimeSpec
    from trials.runtime import TorchGlobals


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (``torchrun``) dies.

    Linux only (elsewhere the driver's leftover search still finds the rank). If the
    parent died before the request took effect, exit now: nobody would kill us later.
    The wrapper names its pid (``SLOTSWEEP_TORCHRUN_PID``): a rank that only read its
    parent's pid here could already see init's, when torchrun died while it started.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    from trials.node.torchrun import PID_ENV_VAR

    expected = os.environ.get(PID_ENV_VAR, "")
    parent = int(expected) if expected.isdigit() else os.getppid()
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        return
    if os.getppid() != parent:
        os._exit(1)


def _fail(message: str) -> int:
    print(f"slotsweep: {message}", file=sys.stderr, flush=True)
    return 2


def _run() -> int:
    import signal

    from trials.labels import trial_label
    from trials.launch.launcher import SpecUnreadableError, spec_from_environment

    # The spec travels in the environment (srun and sbatch pass it on to every node),
    # never as a file on the driver's disk that another node could not read.
    try:
        spec = spec_from_environment()
    except SpecUnreadableError as error:
        for problem in error.problems:
            _fail(problem)
        return 2
    fenced = rank_fenced_start(spec)
    if fenced is not None:
        return fenced

    def _terminate(signum: int, _frame: object) -> None:
        # Unwind normally, so rank 0 commits its queued records and the group is left.
        raise SystemExit(128 + signum)

    with frozen_imports():
        from torch.distributed.elastic.multiprocessing.errors import record

        from trials.runtime import InvalidTrialError, install_checkpoint_on_sigterm, run_trial

    if not install_checkpoint_on_sigterm():
        signal.signal(signal.SIGTERM, _terminate)
    # c10d assigns ranks in arrival order; say which one this process got.
    print(
        f"slotsweep: trial {trial_label(spec.experiment_id, spec.optuna_trial_number)} "
        f"attempt {spec.attempt}: rank "
        f"{os.environ.get('RANK', '0')} of world_size {os.environ.get('WORLD_SIZE', '1')} "
        f"(local rank {os.environ.get('LOCAL_RANK', '0')}) on agent "
        f"{os.environ.get('SLOTSWEEP_AGENT', spec.agent)}",
        flush=True,
    )

    if spec.warm is not None:
        return _run_warm(spec)
    try:
        outcome = record(run_trial)(spec)
    except InvalidTrialError as error:
        return _fail(str(error))
    print(
        f"slotsweep: trial {trial_label(spec.experiment_id, spec.optuna_trial_number)} "
        f"attempt {spec.attempt}: {outcome}",
        flush=True,
    )
    return 0


# A trial that ended otherwise (preempted, stopped) ends its warm job: its slots may be
# wanted elsewhere, and the next trial starts cold.
_WARM_OUTCOMES = ("finished", "pruned")


def _run_warm(spec: RuntimeSpec) -> int:
    """Run trials on this warm job's ranks until the driver ends it or a trial does not finish.

    The process group forms once; each trial gets a fresh context, model, optimizer and
    loaders (:func:`~trials.runtime._runner.run_trial` builds them), re-seeded RNGs,
    torch's global settings as the job started with them, and its user module imported
    afresh (:mod:`trials.runtime._isolation`). A failing trial's exception ends the
    job like a cold trial's.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    from trials.labels import trial_label
    from trials.node._prefix import retarget_output
    from trials.runtime import (
        DistributedInfo,
        InvalidTrialError,
        TorchGlobals,
        WarmChannel,
        barrier,
        destroy_process_group,
        join_job,
        run_trial,
    )

    info = DistributedInfo.from_env()
    # The group forms once, for the job's first trial: a failure here is that trial's.
    joined = join_job(spec, info)
    channel = WarmChannel(spec, info)
    settings = TorchGlobals.capture()
    # The interpreter's and torch's import-time heap is moved out of the collector's
    # reach (as every reset does with what survives a trial): the first reset's full
    # collection then scans only what the first trial made, not ~0.5 s of torch's heap.
    gc.freeze()
    current: RuntimeSpec | None = spec
    try:
        while current is not None:
            label = trial_label(current.experiment_id, current.optuna_trial_number)
            # Rank 0 hands the job back in the trial's last transaction, with its end.
            hand_back = channel.hand_back_write(current.trial_id) if info.is_chief else None
            try:
                outcome = record(run_trial)(current, info, hand_back=hand_back)
            except InvalidTrialError as error:
                return _fail(str(error))
            print(f"slotsweep: trial {label} attempt {current.attempt}: {outcome}", flush=True)
            if outcome not in _WARM_OUTCOMES:
                return 0
            assert current.warm is not None
            imported_output = io.StringIO()
            reset = functools.partial(_reset_and_preload, settings, current, imported_output)
            current = channel.next_trial(current.trial_id, meanwhile=reset)
            if current is None and channel.fenced:
                # Rank 0 found the trial handed over ended or its claim gone.
                from storage import FENCED_EXIT_CODE

                print(f"slotsweep: {channel.end_reason}", file=sys.stderr, flush=True)
                return FENCED_EXIT_CODE
            if current is None:
                # The driver says why in the trial's log; a rank's last line stays the
                # trial's outcome.
                return 0
            if current.log_path:
                retarget_output(current.log_path)
            # The barrier between trials: every rank has reset (in next_trial) and writes
            # to the new trial's log before any starts it.
            barrier()
            print(
                f"slotsweep: trial "
                f"{trial_label(current.experiment_id, current.optuna_trial_number)} attempt "
                f"{current.attempt}: on the warm job's rank {info.rank} of world_size "
                f"{info.world_size}",
                flush=True,
            )
            # What the user's module printed when imported ahead of this trial.
            sys.stdout.write(imported_output.getvalue())
            sys.stdout.flush()
        return 0
    finally:
        if joined:
            destroy_process_group()


def _reset_and_preload(
    settings: TorchGlobals, finished: RuntimeSpec, imported_output: io.StringIO
) -> None:
    """Between two trials of a warm job: reset the process, then import the entrypoint afresh.

    Every trial of the job runs the same experiment's entrypoint, so its import (after
    the reset dropped the user's modules) need not wait for the next trial's spec: done
    here it overlaps the driver's turn-around instead of delaying the next first batch.
    What the module prints meanwhile is kept in ``imported_output`` for the next
    trial's log: the log still open is the finished trial's.
    """
    from trials.runtime import preload_entrypoint, reset_between_trials

    assert finished.warm is not None
    reset_between_trials(
        settings,
        model_dir=finished.model_dir,
        keep_entrypoint_module=finished.warm.keep_entrypoint_module,
    )
    with contextlib.redirect_stdout(imported_output), contextlib.redirect_stderr(imported_output):
        preload_entrypoint(finished)


def main() -> int:
    die_with_parent()
    import faulthandler
    import signal

    # `kill -USR1 PID` prints every thread's stack to the trial's log: what a hung rank
    # is doing, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Back onto the trial's log itself: the output inherited from torchrun is its
    # wrapper's ``[torchrun]`` prefixer.
    write_to_log_target()
    return run_prefixed(f"[rank {os.environ.get('RANK', '0')}] ", _run)


def run_forked() -> None:
    """:func:`main` in a rank forked from its ``torchrun`` wrapper (:mod:`trials.node.torchrun`).

    The child starts as a copy of the agent: it takes a session of its own, as torchrun
    gives a rank it starts as a program (stopping the agent's group must not reach the
    ranks, whose checkpoint on SIGTERM torchrun itself asks for), and the default
    handlers back for the signals torch's agent turned into exceptions. A failing rank
    exits with its code at once; a finished one returns, so torchrun's fork wrapper
    hands its agent the rank's result (a rank that just exited with 0 would be waited
    for forever) and then ends the process without the interpreter's teardown.
    """
    import signal

    from trials.node.torchrun import restore_rank_environment

    os.setsid()
    restore_rank_environment()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    # torch sized its thread pool when the agent imported it, before torchrun set
    # OMP_NUM_THREADS for its ranks (1 each when a node runs several).
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    code = main()
    if code:
        exit_without_teardown(code)
    run_exit_handlers()


if __name__ == "__main__":
    exit_without_teardown(main())
