"""Batch-size arithmetic shared by the driver and every rank."""

from __future__ import annotations


def per_slot_batch_size(global_batch_size: int, slots_per_trial: int) -> tuple[int, int]:
    """Split the global batch across slots: ``(per_slot_batch_size, samples_dropped)``.

    The remainder is dropped (Determined does the same); callers warn when it is not 0.

    Example:
        >>> per_slot_batch_size(130, 4)
        (32, 2)
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int):
        raise ValueError(f"global_batch_size: must be an integer, got {global_batch_size!r}")
    if slots_per_trial < 1:
        raise ValueError(f"slots_per_trial: must be at least 1, got {slots_per_trial}")
    if global_batch_size < slots_per_trial:
        raise ValueError(
            f"global_batch_size: {global_batch_size} is smaller than slots_per_trial "
            f"({slots_per_trial}); each slot needs at least one sample"
        )
    per_slot = global_batch_size // slots_per_trial
    return per_slot, global_batch_size - per_slot * slots_per_trial
