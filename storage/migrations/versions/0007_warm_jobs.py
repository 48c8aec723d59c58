"""warm jobs

``slotsweep_warm_jobs`` records the ``torchrun`` jobs kept alive between trials of one
shape (``resources.reuse_workers``); ``slotsweep_allocations.warm_job_id`` names the
warm job whose processes hold a slot, so the slot ledger stays the one truth about
who holds what while a job waits for its next trial.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 19:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slotsweep_warm_jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "experiment_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_experiments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("resource_pool", sa.String(length=255), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        sa.Column("launch_token", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("current_trial_id", sa.Integer(), nullable=True),
        sa.Column("current_run_id", sa.Integer(), nullable=True),
        sa.Column("reserved_trial_id", sa.Integer(), nullable=True),
        sa.Column("next_run_id", sa.Integer(), nullable=True),
        sa.Column("next_spec", sa.JSON(), nullable=True),
        sa.Column("idle_since", sa.DateTime(), nullable=True),
        sa.Column("trials_run", sa.Integer(), nullable=False),
        sa.Column("end_requested_at", sa.DateTime(), nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
    )
    op.create_index(
        "ix_slotsweep_warm_jobs_experiment_id", "slotsweep_warm_jobs", ["experiment_id"]
    )
    op.create_index("ix_slotsweep_warm_jobs_ended_at", "slotsweep_warm_jobs", ["ended_at"])
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.add_column(sa.Column("warm_job_id", sa.Integer(), nullable=True))
        batch.create_index("ix_slotsweep_allocations_warm_job_id", ["warm_job_id"])


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.drop_index("ix_slotsweep_allocations_warm_job_id")
        batch.drop_column("warm_job_id")
    op.drop_index("ix_slotsweep_warm_jobs_ended_at", table_name="slotsweep_warm_jobs")
    op.drop_index("ix_slotsweep_warm_jobs_experiment_id", table_name="slotsweep_warm_jobs")
    op.drop_table("slotsweep_warm_jobs")
