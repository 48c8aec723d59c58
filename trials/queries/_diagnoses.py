"""Stored diagnoses (``slotsweep diagnose``'s reports): the Diagnosis page's picker and report.

Example:
    >>> from storage import get_engine
    >>> engine = get_engine(url, read_only=True)
    >>> diagnosis_choices(engine).empty, diagnosis_report(engine, 1) is None
    (True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from storage import Diagnosis
from trials.queries._reading import Source, frame_of, reading

if TYPE_CHECKING:
    import pandas as pd

_D = Diagnosis.__table__


def diagnosis_choices(db: Source, limit: int = 200) -> pd.DataFrame:
    """Stored diagnoses, newest first: id, name, verdict, experiment id, when."""
    with reading(db) as conn:
        return frame_of(
            conn.execute(
                sa.select(_D.c.id, _D.c.name, _D.c.verdict, _D.c.experiment_id, _D.c.created_at)
                .order_by(_D.c.id.desc())
                .limit(limit)
            )
        )


def diagnosis_report(db: Source, diagnosis_id: int) -> dict[str, Any] | None:
    """One diagnosis: its row's fields and ``report``, the ``slotsweep diagnose --json``
    document it stored."""
    with reading(db) as conn:
        row = conn.execute(sa.select(_D).where(_D.c.id == diagnosis_id)).mappings().first()
    return None if row is None else dict(row)
