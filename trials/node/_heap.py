"""torch's import with the garbage collector kept off it, and its heap out of the collector's reach.

Importing torch builds some 200,000 long-lived objects. While it runs, the collector's
full collections keep scanning that growing heap (about 0.2 s of CPU per process on
these machines), and every full collection after it scans it again: the import of
``torch._dynamo`` that DDP or the first optimizer triggers costs about 0.3 s more
because of it. :func:`frozen_imports` runs a block of imports with the collector off
and then moves everything they built to the permanent generation (``gc.freeze``), as
a warm job's ranks already do between trials; later collections see only what the
trial itself makes. What it freezes lives as long as the process anyway; the few
thousand cyclic leftovers of the imports are never freed (well under a megabyte).

Used by the ``torchrun`` wrapper around torch's import and by every rank around the
runtime's (:mod:`trials.node.torchrun`, :mod:`trials.node.worker`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_imports() -> Iterator[None]:
    """Run the block with the collector off, then freeze what exists and turn it back on.

    Example:
        >>> with frozen_imports():
        ...     import json
        >>> gc.get_freeze_count() > 0 and gc.isenabled()
        True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
