"""Alembic environment for slotsweep's tables (Optuna migrates its own tables itself)."""

from __future__ import annotations

from alembic import context

from storage._engine import get_engine
from storage._migrate import VERSION_TABLE
from storage._models import Base

config = context.config


def _include_object(obj: object, name: str | None, type_: str, *_: object) -> bool:
    # Optuna's tables share the database; autogenerate must neither drop nor diff them.
    if type_ == "table":
        return bool(name and name.startswith("slotsweep_"))
    return True


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        with get_engine(config.get_main_option("sqlalchemy.url")).connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=_include_object,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
