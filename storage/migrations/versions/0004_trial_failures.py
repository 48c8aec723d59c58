"""trial failures

Each failing rank records its exception (type, message, traceback tail) and how far
its run had got, so the reason reaches the user and the driver can tell a
deterministic failure from one worth a restart.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 05:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slotsweep_trial_failures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("exception_type", sa.String(length=255), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=False),
        sa.Column("steps_completed", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["slotsweep_trial_runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["trial_id"], ["slotsweep_trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_slotsweep_trial_failures_run_id", "slotsweep_trial_failures", ["run_id"])
    op.create_index(
        "ix_slotsweep_trial_failures_trial_id", "slotsweep_trial_failures", ["trial_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_slotsweep_trial_failures_trial_id", table_name="slotsweep_trial_failures")
    op.drop_index("ix_slotsweep_trial_failures_run_id", table_name="slotsweep_trial_failures")
    op.drop_table("slotsweep_trial_failures")
