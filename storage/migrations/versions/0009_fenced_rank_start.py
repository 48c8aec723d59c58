"""fenced rank start

``slotsweep_trial_runs.claim_token`` is the token of the slot claim a run was
launched on, and ``slotsweep_trial_runs.ranks_started_at`` when its first rank
checked, in one transaction, that the run was not ended and that claim still held.
A rank whose check fails exits before it touches a device; a reclaim that finds a
run marked started treats it as gone only once its processes are. Runs written
before this revision have neither: they are not fenced at their start.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 23:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.add_column(sa.Column("claim_token", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("ranks_started_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.drop_column("ranks_started_at")
        batch.drop_column("claim_token")
