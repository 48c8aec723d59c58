"""corrupted checkpoints

A checkpoint whose files fail verification against its manifest's digests (or cannot be
loaded) is kept for inspection in the new state ``CORRUPTED``, with the reason in the
new column ``slotsweep_checkpoints.problem``. The state column stores enum values as
plain strings of up to 16 characters with no CHECK constraint (``native_enum=False``),
so the new value needs no change of the column itself.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_checkpoints") as batch:
        batch.add_column(sa.Column("problem", sa.Text(), nullable=True))


def downgrade() -> None:
    # A CORRUPTED row means nothing to the older code: it reads as a deleted checkpoint
    # (its files stay where they are), so it is never restored from nor collected.
    op.execute("UPDATE slotsweep_checkpoints SET state = 'DELETED' WHERE state = 'CORRUPTED'")
    with op.batch_alter_table("slotsweep_checkpoints") as batch:
        batch.drop_column("problem")
