"""What a failed trial tells the driver: the reason, whether a restart can help, when to stop.

Restarts are for bad luck (a rank killed, a node lost, a transient error after the
trial made progress). A bug is not bad luck: when the ranks of a run failed with the
same exception before completing a step (the trial's constructor, its data loaders,
its first batch), running it again fails the same way, so the trial is not restarted.
Ranks that recorded nothing do not count against that: ``torchrun`` ends a rank's
siblings as soon as it fails, often before they reach the same line. A communication
error (a peer that left, a collective that timed out) is never taken for a bug: it is
what the survivors of a killed rank see.
Nor is a port taken at start-up (``EADDRINUSE`` on the rendezvous store's port or on
the ranks' ``MASTER_PORT``, picked free a moment earlier and taken by another process
meanwhile): the run is a *port clash*, and the trial starts again with fresh ports.
When the first ``fail_fast_trials`` trials of an experiment all failed with the same
error and none has succeeded, the experiment stops with state ERROR instead of spending
the rest of its budget on the same mistake.

Pure functions over plain records; the driver reads the rows and acts.

Example:
    >>> f = FailureRecord(rank=0, exception_type="ValueError", message="bad", steps_completed=0)
    >>> verdict = judge_run([f], world_size=2)
    >>> verdict.deterministic, verdict.reason
    (True, 'ValueError: bad')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage import TrialFailure
from trials.launch.launcher import says_address_in_use


@dataclass(frozen=True)
class FailureRecord:
    """How one rank failed (a ``storage.TrialFailure`` row, in the order recorded)."""

    rank: int
    exception_type: str
    message: str
    steps_completed: int

    @property
    def signature(self) -> tuple[str, str]:
        return (self.exception_type, self.message)

    @property
    def who(self) -> str:
        """``rank N``, or ``torchrun`` for a failure torchrun recorded itself."""
        return "torchrun" if self.rank == TrialFailure.TORCHRUN_RANK else f"rank {self.rank}"


@dataclass(frozen=True)
class RunVerdict:
    """The reason to show for a failed run, and whether restarting it is pointless."""

    reason: str
    deterministic: bool
    signature: tuple[str, str] | None = None
    #: A port the run was given was taken before it started (see :func:`is_port_clash`).
    port_clash: bool = False


def judge_run(failures: Sequence[FailureRecord], *, world_size: int) -> RunVerdict | None:
    """The verdict on a run whose ranks recorded ``failures``; None when none recorded one.

    The reason is the first failing rank's exception (the others often only saw it
    leave), naming that rank when the ranks did not all fail alike before any step.
    ``world_size`` is the run's rank count: it says in the reason how many recorded it.
    The run is a port clash when one failure is (:func:`is_port_clash`) and every other
    one is a communication error before any step (what its siblings saw).
    """
    if not failures:
        return None
    first = failures[0]
    deterministic = (
        all(f.steps_completed == 0 for f in failures)
        and len({f.signature for f in failures}) == 1
        and not is_communication_error(first)
    )
    port_clash = any(is_port_clash(f) for f in failures) and all(
        is_port_clash(f) or (f.steps_completed == 0 and is_communication_error(f))
        for f in failures
    )
    # Which rank came first is chance when they fail alike: leave it out, so the same
    # bug reads the same in every trial (and groups as one reason).
    reason = f"{first.exception_type}: {first.message}"
    if not deterministic:
        reason += f" ({first.who})"
    return RunVerdict(
        reason=reason,
        deterministic=deterministic,
        signature=first.signature,
        port_clash=port_clash,
    )


def is_port_clash(failure: FailureRecord) -> bool:
    """Whether ``failure`` is a port taken before the run started (``EADDRINUSE``).

    torchrun picks its ports free a moment before they are bound (the rendezvous
    store's, the ranks' ``MASTER_PORT``), and another process may take one meanwhile:
    torch then fails with a communication error saying so, before any step. The user's
    own code failing to bind a port (``OSError``) is no clash: it would fail alike again.

    Example:
        >>> is_port_clash(FailureRecord(0, "DistNetworkError",
        ...     "... port: 41234, useIpv6: false, code: -98, name: EADDRINUSE ...", 0))
        True
        >>> is_port_clash(FailureRecord(0, "OSError", "[Errno 98] Address already in use", 0))
        False
    """
    return (
        failure.steps_completed == 0
        and failure.exception_type in (*_COMMUNICATION_TYPES, "RuntimeError")
        and says_address_in_use(failure.message)
    )


_COMMUNICATION_TYPES = frozenset(
    {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "ConnectionError"}
)
_COMMUNICATION_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket")


def is_communication_error(failure: FailureRecord) -> bool:
    """Whether ``failure`` is what a rank sees when another rank or the network fails.

    Example:
        >>> is_communication_error(FailureRecord(0, "RuntimeError", "Connection reset by peer", 0))
        True
        >>> is_communication_error(FailureRecord(0, "ValueError", "bad shape", 0))
        False
    """
    if failure.exception_type in _COMMUNICATION_TYPES:
        return True
    message = failure.message.lower()
    return failure.exception_type == "RuntimeError" and any(
        word in message for word in _COMMUNICATION_WORDS
    )


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of an experiment, in the order the search asked for them."""

    number: int
    succeeded: bool | None  # None: not finished yet
    failure_signature: tuple[str, str] | str | None = None


def fail_fast_reason(outcomes: Sequence[TrialOutcome], limit: int) -> str | None:
    """Why the experiment should stop now, or None.

    It stops when no trial has succeeded and the first ``limit`` trials (by number)
    all failed with the same error. ``limit`` 0 turns this off.
    """
    if limit <= 0 or any(o.succeeded for o in outcomes):
        return None
    first = sorted(outcomes, key=lambda o: o.number)[:limit]
    if len(first) < limit or any(o.succeeded is not False for o in first):
        return None
    signatures = {o.failure_signature for o in first}
    if len(signatures) != 1 or None in signatures:
        return None
    (signature,) = signatures
    shown = ": ".join(signature) if isinstance(signature, tuple) else signature
    return f"the first {limit} trials all failed with the same error and none succeeded: {shown}"
