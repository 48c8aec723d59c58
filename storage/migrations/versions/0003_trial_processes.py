"""trial processes and run progress

A trial's processes (torchrun and every rank, by pid and kernel start time) are
recorded so that a later driver finds and ends leftovers without trusting pid reuse,
and a slot is free only once the processes on it are gone. ``progress_at`` lets the
driver end a run that hangs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.add_column(sa.Column("progress_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("launch_token", sa.String(length=64), nullable=True))
    op.create_table(
        "slotsweep_trial_processes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "role",
            sa.Enum("TORCHRUN", "RANK", name="processrole", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("agent", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("slots", sa.JSON(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("create_time", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["slotsweep_trial_runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["trial_id"], ["slotsweep_trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_slotsweep_trial_processes_run_id", "slotsweep_trial_processes", ["run_id"])
    op.create_index("ix_trial_process_trial", "slotsweep_trial_processes", ["trial_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_trial_process_trial", table_name="slotsweep_trial_processes")
    op.drop_index("ix_slotsweep_trial_processes_run_id", table_name="slotsweep_trial_processes")
    op.drop_table("slotsweep_trial_processes")
    with op.batch_alter_table("slotsweep_trial_runs") as batch:
        batch.drop_column("launch_token")
        batch.drop_column("progress_at")
