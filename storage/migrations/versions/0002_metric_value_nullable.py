"""metric value may be NULL (NaN)

A diverged trial reports NaN losses; SQLite stores NaN as NULL, which the NOT NULL
column refused, so the whole batch of metrics (and the trial's rank 0) failed.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:35:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_metrics") as batch:
        batch.alter_column("value", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM slotsweep_metrics WHERE value IS NULL")
    with op.batch_alter_table("slotsweep_metrics") as batch:
        batch.alter_column("value", existing_type=sa.Float(), nullable=False)
