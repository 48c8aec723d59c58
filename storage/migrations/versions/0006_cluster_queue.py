"""one queue for the cluster

Every queued trial of every experiment sharing the database waits in
``slotsweep_queue`` with its pool, size, priority, weight and arrival, so one
placement decision orders them all (priority, fair share, FIFO, backfilling).
``slotsweep_trial_runs.stop_reason`` says why another driver asked a run to stop
(preemption by a higher-priority trial).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slotsweep_queue",
        sa.Column(
            "trial_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_trials.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "experiment_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_experiments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("resource_pool", sa.String(length=255), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("queued_at", sa.DateTime(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
    )
    op.create_index(
        "ix_slotsweep_queue_class", "slotsweep_queue", ["experiment_id", "slots", "priority"]
    )
    op.create_index("ix_slotsweep_queue_resource_pool", "slotsweep_queue", ["resource_pool"])
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.drop_column("stop_reason")
    op.drop_index("ix_slotsweep_queue_resource_pool", table_name="slotsweep_queue")
    op.drop_index("ix_slotsweep_queue_class", table_name="slotsweep_queue")
    op.drop_table("slotsweep_queue")
