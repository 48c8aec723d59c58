"""Create and upgrade slotsweep's schema through Alembic."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from storage._url import resolve_db_url

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where it is used: trial ranks import ``storage`` to record
# metrics and never migrate, so they should not pay for Alembic (and Mako) at start-up.

# Optuna keeps its own ``alembic_version`` table in the same database.
VERSION_TABLE = "slotsweep_alembic_version"
_MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """The Alembic configuration for ``url``, usable with ``alembic.command``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", resolve_db_url(url).replace("%", "%%"))
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def current_revision(url: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from storage._engine import get_engine

    with get_engine(url).connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


@functools.lru_cache(maxsize=16)
def _upgraded(url: str) -> bool:
    from alembic import command

    from storage._lock import schema_lock

    with schema_lock(url):
        if current_revision(url) != head_revision():
            command.upgrade(alembic_config(url), "head")
    return True


def upgrade_schema(url: str | None = None) -> None:
    """Bring the database at ``url`` to the newest schema (once per process and URL)."""
    _upgraded(resolve_db_url(url))
