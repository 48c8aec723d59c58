"""PostgreSQL for the storage tests: the fixtures live in ``tests/conftest.py``.

Re-exported here for the test modules elsewhere that import them by name.
"""

from __future__ import annotations

from tests.conftest import postgres_server, postgres_url

__all__ = ["postgres_server", "postgres_url"]
