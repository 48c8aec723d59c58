"""fusion choices

``slotsweep_fusion_choices`` keeps the DDP bucket size that
``optimizations.auto_tune_tensor_fusion`` chose for a model shape and world size
within an experiment, so later trials of the same shape re-use it instead of probing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 02:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "slotsweep_fusion_choices",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "experiment_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_experiments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("shape_key", sa.String(length=64), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("bucket_mb", sa.Float(), nullable=False),
        sa.Column(
            "trial_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_trials.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("experiment_id", "shape_key", "world_size", name="uq_fusion_choice"),
    )


def downgrade() -> None:
    op.drop_table("slotsweep_fusion_choices")
