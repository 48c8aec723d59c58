"""Shares of one slot: the fractions a small trial may ask for, and how they are counted.

A slot is one GPU (or, without GPUs, one CPU process). ``resources.slots_per_trial``
takes a whole number of slots, or a share ``1/k`` of ONE slot for a trial of one rank:
``0.5``, ``0.25`` or ``0.125``. Several share trials then run on one slot at once, as
Ray Tune's ``{"gpu": 0.25}`` does; a share trial never spans slots or agents.

Why these k, and only these:

* Powers of two are exact in binary floating point. ``0.5 + 0.25 + 0.125 + 0.125`` is
  exactly ``1.0``, so shares written in a config, added up by the scheduler and
  compared with a slot's capacity never round (``0.1 + 0.2 != 0.3``; ``1/3`` has no
  exact float at all), and the check "no slot's claims add up to more than one" is exact.
* The slot ledger stores a share as a whole number of eighths of a slot
  (:data:`EIGHTHS_PER_SLOT`), so the database adds and compares integers; every allowed
  share is a whole number of eighths, and shares of different sizes pack into one slot
  without leftovers that nothing can use (``1/2 + 1/4 + 1/8 + 1/8``).
* Eight trials per GPU is the finest worth having: every process on a GPU pays its own
  CUDA context (about 0.5 GB and its own kernel queue), and without CUDA MPS the GPU
  time-slices between contexts, so a ninth small trial adds more switching than work.
  An eighth of an 80-141 GB GPU (10-17 GB) still holds a small model's trial.

Example:
    >>> slot_eighths(0.25), slot_share_of(2), format_share(0.125)
    (2, 0.25, '1/8')
    >>> share_problem(0.3)
    'must be a whole number of slots (1, 2, ...) or a share of one slot: 0.5, 0.25 or 0.125'
"""

from __future__ import annotations

EIGHTHS_PER_SLOT = 8
"""A slot in the ledger's unit: a claim holds a whole number of eighths of its slot."""

SLOT_SHARES: tuple[float, ...] = (0.5, 0.25, 0.125)
"""The shares of one slot a trial may ask for (``resources.slots_per_trial``)."""

ALLOWED_SHARES = ", ".join(f"{share:g}" for share in SLOT_SHARES[:-1]) + (
    f" or {SLOT_SHARES[-1]:g}"
)
"""The shares of one slot, in the words every refusal uses: ``0.5, 0.25 or 0.125``."""

ALLOWED_SLOTS_PER_TRIAL = (
    f"a whole number of slots (1, 2, ...) or a share of one slot: {ALLOWED_SHARES}"
)
"""What ``slots_per_trial`` takes, in the words every refusal uses."""


def is_slot_share(value: float) -> bool:
    """Whether ``value`` is one of :data:`SLOT_SHARES` (``1.0`` is a whole slot, not a share).

    Example:
        >>> is_slot_share(0.5), is_slot_share(1.0), is_slot_share(0.3)
        (True, False, False)
    """
    return value in SLOT_SHARES


def share_problem(value: float) -> str | None:
    """Why ``value`` is no ``slots_per_trial``, naming what is allowed; None when it is one.

    The caller adds the value itself (the config's one-line errors end ``(got 0.3)``).

    Example:
        >>> share_problem(2), share_problem(0.125), share_problem(1.5) is not None
        (None, None, True)
    """
    if is_slot_share(value) or (float(value).is_integer() and value >= 1):
        return None
    return f"must be {ALLOWED_SLOTS_PER_TRIAL}"


def slot_eighths(share: float) -> int:
    """The eighths of a slot a share takes (a whole slot: :data:`EIGHTHS_PER_SLOT`).

    ``ValueError`` for anything but a whole slot or one of :data:`SLOT_SHARES`.

    Example:
        >>> [slot_eighths(share) for share in (1.0, 0.5, 0.25, 0.125)]
        [8, 4, 2, 1]
    """
    if share != 1.0 and not is_slot_share(share):
        raise ValueError(f"a share of a slot {share_problem(share)} (got {share:g})")
    return int(share * EIGHTHS_PER_SLOT)


def slot_share_of(eighths: int) -> float:
    """The share of a slot that ``eighths`` eighths are (exact: a power of two over 8).

    Example:
        >>> slot_share_of(8), slot_share_of(1)
        (1.0, 0.125)
    """
    if not 1 <= eighths <= EIGHTHS_PER_SLOT:
        raise ValueError(f"a slot has 1 to {EIGHTHS_PER_SLOT} eighths, not {eighths}")
    return eighths / EIGHTHS_PER_SLOT


def format_share(share: float) -> str:
    """A share as people read it: ``1/4``; a whole slot is ``1``.

    Example:
        >>> format_share(0.5), format_share(1.0), format_share(0.75)
        ('1/2', '1', '3/4')
    """
    eighths = round(share * EIGHTHS_PER_SLOT)
    if eighths == EIGHTHS_PER_SLOT:
        return "1"
    numerator, denominator = eighths, EIGHTHS_PER_SLOT
    while numerator % 2 == 0 and denominator > 1:
        numerator //= 2
        denominator //= 2
    return f"{numerator}/{denominator}"
