"""warm next trial ahead

``slotsweep_warm_jobs.ahead_trial_id`` is the trial a driver decided ahead, while the
job ran a trial, to run next on the job, and ``slotsweep_warm_jobs.ahead`` its
prepared start (the queue priority it was decided at, the claim token, the log path
and the runtime spec). Rank 0 starts that trial itself in its hand-back's transaction
while the queue still gives it the job; otherwise it hands the job back as before.
Jobs written before this revision have none.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 11:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_warm_jobs") as batch:
        batch.add_column(sa.Column("ahead_trial_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("ahead", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_warm_jobs") as batch:
        batch.drop_column("ahead")
        batch.drop_column("ahead_trial_id")
