"""executor runs

A trial run records which executor started it and that executor's own id for it (a
Slurm job or job step), so a later driver ends the leftovers of a crash through the
same executor. ``stop_requested_at`` carries a stop request (pause, preemption) to the
run's rank 0 through the database, which every node reaches, instead of a file on the
driver's disk. ``spec`` keeps the RuntimeSpec the run was launched with (without
the database URL), which used to be a file beside the trial's log.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 08:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.add_column(
            sa.Column("executor", sa.String(length=32), nullable=False, server_default="local")
        )
        batch.add_column(sa.Column("external_id", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("stop_requested_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("spec", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.drop_column("spec")
        batch.drop_column("stop_requested_at")
        batch.drop_column("external_id")
        batch.drop_column("executor")
