"""``torchrun`` whose own output lines carry ``[torchrun] ``: ``python -m trials.node.torchrun ARGS``.

Every line of a trial's log says who wrote it: ranks prefix theirs with ``[rank N] ``
(:mod:`trials.node.worker`), the driver its own with ``[slotsweep] ``, and this wrapper
prefixes torchrun's (its logging, its error summary) with ``[torchrun] ``. The prefixing
happens in this process, not through a pipe to the driver: the driver may die while
the trial runs, and a broken pipe would take ``torchrun`` down with it.

The wrapper runs ``torch.distributed.run.main`` in-process, so it *is* the trial's
``torchrun`` (the driver records its pid as such, stopping it stops the attempt, and
the ranks, its children, die with it through ``PR_SET_PDEATHSIG``). The ranks are
forked from it (:func:`forked_ranks`): torch is imported once per node, by the agent,
instead of once more by every rank (1.5 s of CPU or more each, paid by every cold
trial). Its prefixer child exits once the wrapper is gone (the pipe's last writer).
Ranks write to the log itself, not through this prefixer: the wrapper keeps a
descriptor of the original output open and names it to them in
``SLOTSWEEP_LOG_TARGET`` as a path, ``/proc/PID/fd/N``, which also reaches ranks that
plain torchrun starts as programs (with ``close_fds``: a descriptor would not).

A failing rank records its own failure; torchrun failing before it starts any rank
records nothing, except here: when the port of its rendezvous store was taken
(``EADDRINUSE``), the wrapper records that under the attempt's run, as the ranks
would (rank ``storage.TrialFailure.TORCHRUN_RANK``), so the driver starts the trial
again with fresh ports instead of counting a restart. Ranks that exit fenced at their
start (``storage.FENCED_EXIT_CODE``: the run was ended or its slot claim lost while its
driver was stopped) make the wrapper exit with that code too, not torchrun's 1.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trials.launch.launcher import (
    SpecUnreadableError,
    ranks_per_node,
    says_address_in_use,
    spec_from_environment,
)
from trials.launch.processes import LAUNCH_TOKEN_ENV_VAR, torchrun_log_prefix
from trials.node._fence import NodeFence
from trials.node._heap import frozen_imports
from trials.node._prefix import LOG_TARGET_ENV_VAR, run_prefixed

if TYPE_CHECKING:
    from trials.config import RuntimeSpec

PREFIX = "[torchrun] "
# Ranks check that their parent is still this process once they have asked to die
# with it (trials.node.worker.die_with_parent): one that died first is not waited for.
PID_ENV_VAR = "SLOTSWEEP_TORCHRUN_PID"
# torch's agent asks whether CUDA is available (its LaunchConfig does). Answered by
# CUDA itself, the question marks every process forked afterwards unable to use a GPU
# (torch's "poison fork"); answered by NVML, it does not. The ranks get the variable
# back as it was (:func:`restore_rank_environment`), from the JSON in
# RANK_ENVIRONMENT_ENV_VAR (the wrapper runs as __main__: a module global of it would
# not be this module's in the rank).
NVML_CHECK_ENV_VAR = "PYTORCH_NVML_BASED_CUDA_CHECK"
RANK_ENVIRONMENT_ENV_VAR = "SLOTSWEEP_RANK_ENVIRONMENT"


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: this process's arguments); its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if sys.platform.startswith("linux") and os.path.isdir(f"/proc/{os.getpid()}/fd"):
        # Kept open (and unused) for the whole run: the ranks reopen it by this path.
        original = os.dup(1)
        os.environ[LOG_TARGET_ENV_VAR] = f"/proc/{os.getpid()}/fd/{original}"
    os.environ[PID_ENV_VAR] = str(os.getpid())
    os.environ[RANK_ENVIRONMENT_ENV_VAR] = json.dumps(
        {NVML_CHECK_ENV_VAR: os.environ.get(NVML_CHECK_ENV_VAR)}
    )
    os.environ[NVML_CHECK_ENV_VAR] = "1"

    def torchrun() -> int:
        spec = _spec()
        fence = NodeFence(spec) if spec is not None else None
        ranks_args = forked_ranks(args)
        with frozen_imports():
            from torch.distributed.run import main as torchrun_main

            if ranks_args != list(args) and ranks_per_node(args) > 1:
                # Ranks import torch._dynamo (torch's optimizers' constructors do, and
                # DDP's): about 1.4 s of CPU, paid once here for every rank forked from
                # here. No CUDA call: the ranks can still use their GPUs. A node's only
                # rank imports it itself if it needs it (a plain function may not).
                import torch._dynamo  # noqa: F401

        fenced = fence.verdict() if fence is not None else None
        if fenced is not None:
            # The child said why (the run ended or its slot claim is gone); no rank
            # started, nothing touched a device: the driver reads this code as no failure.
            return fenced

        # torchrun keeps its ranks' error files in a folder it never removes, by default
        # one of its own in the temporary folder: one left there per trial attempt.
        # Named after the attempt: the driver removes it if this wrapper is SIGKILLed.
        log_dir = tempfile.mkdtemp(
            prefix=torchrun_log_prefix(os.environ.get(LAUNCH_TOKEN_ENV_VAR))
        )
        # A failure (a rank failed: torchrun's error summary) is printed prefixed, as
        # ``python -m torch.distributed.run`` would print it.
        try:
            torchrun_main(with_log_dir(ranks_args, log_dir))
        except Exception as error:
            if ranks_fenced(error):
                from storage import FENCED_EXIT_CODE

                # Its ranks said why (the run ended or its slot claim is gone) and
                # touched nothing: the driver reads this code as no failure.
                return FENCED_EXIT_CODE
            taken = port_taken(error)
            if taken is not None and spec is not None:
                _record_port_taken(spec, taken)
            raise
        finally:
            # Forked ranks leave through os._exit in torch's fork wrapper, never this way.
            shutil.rmtree(log_dir, ignore_errors=True)
        return 0

    return run_prefixed(PREFIX, torchrun)


def forked_ranks(args: Sequence[str]) -> list[str]:
    """``args`` with the ranks of ``-m trials.node.worker`` forked from this process.

    torchrun's own in-interpreter start (``--start-method=fork --run-path SCRIPT``)
    runs the rank's program in a child of the agent, which has imported torch: a rank
    then starts in milliseconds instead of importing torch again (1.5 s of CPU or more
    per rank). The script is this node's copy of :mod:`trials.node._forked_rank`.

    Example:
        >>> forked_ranks(["--nnodes=1", "-m", "trials.node.worker"])[:3]
        ['--nnodes=1', '--start-method=fork', '--run-path']
        >>> forked_ranks(["--help"])
        ['--help']
    """
    if list(args[-2:]) != ["-m", "trials.node.worker"]:
        return list(args)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_forked_rank.py")
    return [*args[:-2], "--start-method=fork", "--run-path", script]


def with_log_dir(args: Sequence[str], log_dir: str) -> list[str]:
    """``args`` with torchrun's log folder (its ranks' error files) set to ``log_dir``.

    Put first: torchrun's options precede the program, and one ``args`` already gives
    comes later and wins.

    Example:
        >>> with_log_dir(["--nnodes=1", "-m", "trials.node.worker"], "/tmp/x")[:2]
        ['--log-dir=/tmp/x', '--nnodes=1']
    """
    return [f"--log-dir={log_dir}", *args]


def restore_rank_environment() -> None:
    """In a rank forked from this wrapper: the variables set for the agent alone, as they were.

    Example:
        >>> restore_rank_environment()  # nothing set by a wrapper in this process
    """
    saved = json.loads(os.environ.pop(RANK_ENVIRONMENT_ENV_VAR, "{}"))
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _spec() -> RuntimeSpec | None:
    """The trial's spec from the environment; None without one, or one that cannot be
    read (the ranks say what is wrong with it)."""
    try:
        return spec_from_environment()
    except SpecUnreadableError:
        return None


def ranks_fenced(error: BaseException) -> bool:
    """Whether ``error`` is torchrun's report of ranks that exited fenced at their start.

    The first rank to fail decides: the others are ended by torchrun after it.

    Example:
        >>> ranks_fenced(RuntimeError("no ranks"))
        False
    """
    if type(error).__name__ != "ChildFailedError":
        return False
    from storage import FENCED_EXIT_CODE

    _, first = error.get_first_failure()  # type: ignore[attr-defined]
    return bool(first.exitcode == FENCED_EXIT_CODE)


def port_taken(error: BaseException) -> BaseException | None:
    """The error in ``error``'s chain saying that a port torchrun itself binds was taken.

    torchrun wraps it (``RendezvousConnectionError`` from ``DistNetworkError``). A
    failed rank (``ChildFailedError``, whose summary may quote the rank's own error)
    is none: the rank recorded its failure itself.

    Example:
        >>> port_taken(RuntimeError("code: -98, name: EADDRINUSE")) is not None
        True
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "ChildFailedError":
            return None
        if isinstance(current, RuntimeError) and says_address_in_use(str(current)):
            return current
        current = current.__cause__ or current.__context__
    return None


def _record_port_taken(spec: RuntimeSpec, error: BaseException) -> None:
    """Record ``error`` as this torchrun's failure under the attempt's run."""
    from storage import TrialFailure
    from trials.runtime import record_failure

    record_failure(spec, TrialFailure.TORCHRUN_RANK, error, 0)


if __name__ == "__main__":
    # Its ranks are gone and what it wrote is committed (it writes only a port clash's
    # failure): torch's teardown (0.1-0.7 s of CPU) would only delay the driver's
    # seeing the attempt end.
    from trials.node.exiting import exit_without_teardown

    exit_without_teardown(main())
