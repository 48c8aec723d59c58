"""Why a request is still queued after a scheduling pass, in words and as a kind.

The explaining half of the scheduler core (:meth:`SlotScheduler.why_waiting
<trials.scheduler.SlotScheduler.why_waiting>`): against the free slots now and what the
last pass reserved, a request waits for the agents reserved for the blocked head, behind
a higher priority, because its experiment holds its fair share (weighted max-min of the
pool's slots), or because nothing of its shape is free. Reasons are derived on demand and
cached until the scheduler's state changes, so asking for every queued request is cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Literal

from trials.config import EIGHTHS_PER_SLOT, format_share
from trials.scheduler._free_slots import FreeSlots

WaitKind = Literal["no_fit", "reserved", "priority", "fair_share"]


@dataclass(frozen=True)
class WaitReason:
    """Why a request is still queued after a :meth:`SlotScheduler.schedule` pass.

    ``kind`` is for code (a badge, a metric label); ``text`` is one line for people.
    ``blocked_by`` is the request the free slots are held back for (kind ``"reserved"``).

    Example:
        >>> WaitReason("priority", "behind priority 1 trials")
        WaitReason(kind='priority', text='behind priority 1 trials', blocked_by=None)
    """

    kind: WaitKind
    text: str
    blocked_by: Hashable | None = None


# The label functions a cached reason was formatted with, and the reason.
_CachedReason = tuple[Callable[[Hashable], str], Callable[[Hashable], str], WaitReason]


def _water_fill(
    capacity: float, demand: Mapping[Hashable, float], weight: Mapping[Hashable, float]
) -> dict[Hashable, float]:
    """Weighted max-min fair shares of ``capacity``: ``weight * level`` each, capped by demand.

    Groups asking for less than their weighted part keep what they ask for, and what they
    leave is split among the others in proportion to their weights (water-filling).

    Example:
        >>> _water_fill(10, {"a": 2, "b": 20, "c": 20}, {"a": 1, "b": 1, "c": 3})
        {'a': 2, 'b': 2.0, 'c': 6.0}
    """
    shares: dict[Hashable, float] = {}
    left = float(capacity)
    weight_left = sum(weight[group] for group in demand)
    for group in sorted(demand, key=lambda g: demand[g] / weight[g]):
        share = min(demand[group], left * weight[group] / weight_left)
        shares[group] = share
        left -= share
        weight_left -= weight[group]
    return {group: shares[group] for group in demand}


def _count(n: int, noun: str) -> str:
    """``1 free slot``, ``2 free slots``: reasons read as words."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class WaitReasons:
    """The wait reasons of one scheduler, cached per (size, group, priority) until cleared.

    Sizes are in eighths of a slot (a whole slot is 8), as the scheduler keeps them.

    It reads, and never changes, the scheduler's free slots and its demand ledgers, which
    it is handed once, by reference, and which the scheduler updates in place: slots held,
    weight and backlog per group, queued slots per priority and group, queued requests
    per priority, and the priority each group last submitted at. The scheduler calls
    :meth:`clear` whenever any of them changes.
    """

    def __init__(
        self,
        free: FreeSlots,
        *,
        held: Mapping[Hashable, float],
        weight: Mapping[Hashable, float],
        backlog: Mapping[Hashable, float],
        queued_slots: Mapping[int, Mapping[Hashable, float]],
        queued_count: Mapping[int, int],
        last_priority: Mapping[Hashable, int],
    ) -> None:
        self._free = free
        self._held = held
        self._weight = weight
        self._backlog = backlog
        self._queued_slots = queued_slots
        self._queued_count = queued_count
        self._last_priority = last_priority
        # Derived since the last change: reasons per (slots, group, priority) and fair
        # shares per priority.
        self._reasons: dict[tuple[int, Hashable, int], _CachedReason] = {}
        self._shares: dict[int, dict[Hashable, float]] = {}

    def clear(self) -> None:
        """Forget what was derived: the state it was derived from changed."""
        self._reasons.clear()
        self._shares.clear()

    def no_fit(self, eighths: int) -> WaitReason:
        """The reason of a request nothing of whose shape is free (the blocked head's)."""
        return WaitReason("no_fit", self._no_fit_text(eighths))

    def reason(
        self,
        eighths: int,
        group: Hashable,
        priority: int,
        *,
        head: Hashable | None,
        reserved: frozenset[int],
        label: Callable[[Hashable], str],
        group_label: Callable[[Hashable], str],
    ) -> WaitReason:
        """Why a queued request other than the blocked head ``head`` waits (cached).

        ``reserved`` holds the agents the last pass reserved for ``head``.
        """
        key = (eighths, group, priority)
        cached = self._reasons.get(key)
        if cached is not None and cached[0] is label and cached[1] is group_label:
            return cached[2]
        reason = self._reason(eighths, group, priority, head, reserved, label, group_label)
        self._reasons[key] = (label, group_label, reason)
        return reason

    def _reason(
        self,
        eighths: int,
        group: Hashable,
        priority: int,
        head: Hashable | None,
        reserved: frozenset[int],
        label: Callable[[Hashable], str],
        group_label: Callable[[Hashable], str],
    ) -> WaitReason:
        fits = self._free.fits
        if reserved and not fits(eighths, reserved) and fits(eighths, frozenset()):
            names = ", ".join(self._free.agents[i].name for i in sorted(reserved))
            return WaitReason(
                "reserved",
                f"agents {names} reserved for trial {label(head)} by backfilling",
                blocked_by=head,
            )
        lowest = min(self._queued_count)
        if lowest < priority:
            return WaitReason("priority", f"behind priority {lowest} trials")
        if len(self._queued_slots[priority]) > 1:
            share = self._fair_shares(priority)[group]
            held = self._held.get(group, 0)
            # A share computed in floats may miss an integer holding by a rounding error.
            if held >= share - 1e-9:
                return WaitReason(
                    "fair_share",
                    f"fair share: experiment {group_label(group)} holds its share "
                    f"({held:g} of {round(share, 1):g} slots)",
                )
        return self.no_fit(eighths)

    def _fair_shares(self, priority: int) -> dict[Hashable, float]:
        """Each group's weighted max-min share of the pool at ``priority`` (cached)."""
        shares = self._shares.get(priority)
        if shares is not None:
            return shares
        held, weight = self._held, self._weight
        demand = {
            group: held.get(group, 0) + slots + self._backlog.get(group, 0)
            for group, slots in self._queued_slots.get(priority, {}).items()
        }
        # A group with nothing queued still takes part with what it holds, at the
        # priority of the last request it submitted here.
        for group, slots in held.items():
            if slots and group not in demand and self._last_priority.get(group) == priority:
                demand[group] = slots
        shares = _water_fill(self._free.total, demand, {g: weight.get(g, 1.0) for g in demand})
        self._shares[priority] = shares
        return shares

    def _no_fit_text(self, eighths: int) -> str:
        pool = self._free.pool.name
        if eighths < EIGHTHS_PER_SLOT:
            share = format_share(eighths / EIGHTHS_PER_SLOT)
            return f"no slot in pool {pool} has {share} of a slot free"
        slots = eighths // EIGHTHS_PER_SLOT
        if slots <= self._free.largest:
            return f"no agent in pool {pool} has {_count(slots, 'free slot')}"
        if self._free.heterogeneous:
            return f"pool {pool} has fewer than {_count(slots, 'slot')} on whole free agents"
        size = self._free.agent_size_for(slots)
        return (
            f"pool {pool} has fewer than {_count(slots // size, 'free agent')} "
            f"of {_count(size, 'slot')}"
        )
