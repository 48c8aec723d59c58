"""Optuna's RDBStorage on slotsweep's database, with the same multi-process safety."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from storage._engine import engine_kwargs, prepare_engine, reading_only
from storage._url import resolve_db_url

if TYPE_CHECKING:
    from optuna.storages import RDBStorage


#: RDBStorage's methods that only read (those an Optuna version lacks are skipped).
_READ_METHODS = (
    "get_all_studies",
    "get_study_id_from_name",
    "get_study_name_from_id",
    "get_study_directions",
    "get_study_user_attrs",
    "get_study_system_attrs",
    "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id",
    "get_trial",
    "get_all_trials",
    "_get_trials",
    "get_n_trials",
    "get_best_trial",
    "_get_best_trial_id",
    "get_trial_param",
    "get_trial_params",
    "get_trial_user_attrs",
    "get_trial_system_attrs",
)


@functools.cache
def _storage_class() -> type[RDBStorage]:
    """RDBStorage whose reads run in deferred transactions (:func:`storage.reading_only`).

    Every other transaction on SQLite takes the write lock up front; Optuna's reads of a
    study's trials (the sampler's, the pruner's) hold it for several milliseconds each
    while they build the trials, and the trials' ranks wait behind them to record.
    """
    from optuna.storages import RDBStorage

    def reading(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def read(self: RDBStorage, *args: Any, **kwargs: Any) -> Any:
            with reading_only():
                return method(self, *args, **kwargs)

        return read

    methods = {
        name: reading(getattr(RDBStorage, name))
        for name in _READ_METHODS
        if hasattr(RDBStorage, name)
    }
    return type("SlotsweepRDBStorage", (RDBStorage,), methods)


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
    from storage._lock import schema_lock

    resolved = resolve_db_url(url)
    # Two drivers starting on a new database would both create Optuna's tables.
    with schema_lock(resolved):
        storage = _storage_class()(
            resolved, engine_kwargs=engine_kwargs(resolved), skip_table_creation=read_only
        )
    prepare_engine(storage.engine, read_only=read_only)
    return storage


@contextlib.contextmanager
def optuna_writes_together(storage: RDBStorage) -> Iterator[None]:
    """Optuna's writes through ``storage`` in this block (this thread) commit as one.

    Optuna commits each suggested parameter in a transaction of its own: six
    hyperparameters are six transactions, each taking SQLite's write lock that the
    trials' ranks wait for. Inside this block its sessions in this thread join one
    transaction, each Optuna commit a savepoint, all committed at the end (or none, if
    the block raises); other threads' sessions are not touched. Keep the block short:
    on SQLite it holds the write lock throughout, so a sampler's work belongs before it.

    Example:
        >>> import optuna
        >>> storage = optuna_storage(url)
        >>> study = optuna.create_study(storage=storage)
        >>> trial = study.ask()
        >>> with optuna_writes_together(storage):
        ...     x, y = trial.suggest_int("x", 0, 9), trial.suggest_int("y", 0, 9)
        >>> sorted(study.trials[-1].params)
        ['x', 'y']
    """
    sessions = storage.scoped_session
    sessions.remove()
    with storage.engine.connect() as connection, connection.begin():
        # This thread's session only (Optuna asks its scoped registry for one per call).
        joined = sessions.session_factory(
            bind=connection, join_transaction_mode="create_savepoint"
        )
        sessions.registry.set(joined)
        try:
            yield
        finally:
            sessions.remove()
