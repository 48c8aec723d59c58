"""training started

``slotsweep_trial_runs.training_started_at`` is when rank 0 of a run began its first
batch, its start-up done. Pruning rungs in slot-seconds (``searcher.pruner.resource:
slot_seconds``) count a trial's compute from it, run by run, so the count survives a
restart. Runs written before this revision have none: they count no compute.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 02:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.add_column(sa.Column("training_started_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.drop_column("training_started_at")
