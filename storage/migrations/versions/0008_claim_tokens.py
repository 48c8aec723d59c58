"""fenced slot claims

``slotsweep_allocations.claim_token`` is the token of the claim that holds a slot,
written by the placement decision (or warm reservation) that made the claim;
``slotsweep_queue.claim_token`` carries it with the queue row's placement to the
owning driver, whose launch re-checks it in the transaction that records the run. A
claim reclaimed after its lease expired, or taken over by a later claim, no longer
matches, and the launch starts nothing. Rows written before this revision have no
token; they match a placement without one.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 16:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.add_column(sa.Column("claim_token", sa.String(length=64), nullable=True))
    with op.batch_alter_table("slotsweep_queue") as batch:
        batch.add_column(sa.Column("claim_token", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_queue") as batch:
        batch.drop_column("claim_token")
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.drop_column("claim_token")
