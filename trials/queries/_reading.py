"""Where a query reads from, and the shapes of what it returns: a page, a frame.

Every query takes ``db``, a :data:`Source`: an ``Engine`` (the UI's read-only one), the
caller's ``Session`` or an open connection. With an engine a query opens its own short
connection and closes it before returning: a read transaction left open would pin an
old WAL snapshot and keep SQLite from checkpointing while the driver and trials write.
With a session or a connection it reads inside the caller's transaction, so the driver
counts the trials it has just written, the CLI reads one snapshot for a whole command,
and one query builds on another within its own connection.

pandas loads on first use (:func:`frame_of`, :func:`table`): the driver and the CLI
read counts and typed rows here and never pay for it.

Example:
    >>> from storage import get_engine
    >>> with reading(get_engine("sqlite://")) as conn:
    ...     conn.execute(sa.text("select 1")).scalar()
    1
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    import pandas as pd

Source: TypeAlias = Engine | sa.Connection | Session
"""Where a query reads: an engine (a short connection of its own), or the caller's open
connection or session."""


@contextlib.contextmanager
def reading(db: Source) -> Iterator[sa.Connection | Session]:
    """What the query's statements run on: the engine's own short connection, closed on
    leaving, or the caller's connection or session as it is (the caller ends its
    transaction)."""
    if isinstance(db, Engine):
        with db.connect() as conn:
            yield conn
    else:
        yield db


@contextlib.contextmanager
def orm_session(db: Source) -> Iterator[Session]:
    """An ORM session on ``db``, for the readers that take one (the cluster's queue)."""
    if isinstance(db, Session):
        yield db
    else:
        with Session(db) as session:
            yield session


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a table: its rows and how many rows the whole table has."""

    rows: pd.DataFrame
    total: int
    offset: int
    limit: int


def frame_of(result: sa.Result[Any]) -> pd.DataFrame:
    """The rows of ``result`` as a frame, its columns named as the statement named them."""
    import pandas as pd

    return pd.DataFrame(result.mappings().all(), columns=list(result.keys()))


def table(rows: Sequence[Any], columns: Sequence[str]) -> pd.DataFrame:
    """``rows`` (mappings or tuples) as a frame with exactly ``columns``, also when there is none."""
    import pandas as pd

    return pd.DataFrame(list(rows), columns=list(columns))


def enum_value(value: Any) -> Any:
    """An enum column's value as text (a raw SQL read may already give the text)."""
    return getattr(value, "value", value)
