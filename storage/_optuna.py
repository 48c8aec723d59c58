"""Optuna's RDBStorage on slotsweep's database, with the same multi-process safety."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from storage._engine import engine_kwargs, prepare_engine
from storage._url import resolve_db_url

if TYPE_CHECKING:
    from optuna.storages import RDBStorage


@functools.lru_cache(maxsize=8)
def optuna_storage(url: str | None = None, read_only: bool = False) -> RDBStorage:
    """Optuna's storage for the study tables in the same database as slotsweep's.

    Optuna imports lazily so processes that never touch a study (most ranks) do not
    pay for it. ``read_only`` storages (the UI) create no tables and start deferred
    transactions, so reading a study never takes the write lock from the driver.

    Example:
        >>> import optuna
        >>> study = optuna.create_study(study_name="example", storage=optuna_storage(url))
        >>> study.study_name in optuna.get_all_study_names(optuna_storage(url))
        True
    """
    from optuna.storages import RDBStorage

    from storage._lock import schema_lock

    resolved = resolve_db_url(url)
    # Two drivers starting on a new database would both create Optuna's tables.
    with schema_lock(resolved):
        storage = RDBStorage(
            resolved, engine_kwargs=engine_kwargs(resolved), skip_table_creation=read_only
        )
    prepare_engine(storage.engine, read_only=read_only)
    return storage
