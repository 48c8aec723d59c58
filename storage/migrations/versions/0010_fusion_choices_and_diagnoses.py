"""fusion choices and diagnoses

``slotsweep_fusion_choices`` keeps the DDP bucket size that
``optimizations.auto_tune_tensor_fusion`` chose for a model shape and world size
within an experiment (with the parameters and gradient bytes it exchanges), so later
trials of the same shape re-use it instead of probing. ``slotsweep_diagnoses`` keeps
what ``slotsweep diagnose`` measured and concluded, linked to an experiment or not.

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
        sa.Column("parameters", sa.BigInteger(), nullable=False),
        sa.Column("gradient_bytes", sa.BigInteger(), nullable=False),
        sa.Column(
            "trial_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_trials.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("experiment_id", "shape_key", "world_size", name="uq_fusion_choice"),
    )
    op.create_table(
        "slotsweep_diagnoses",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "experiment_id",
            sa.Integer(),
            sa.ForeignKey("slotsweep_experiments.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("config_path", sa.Text(), nullable=True),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index(
        "ix_slotsweep_diagnoses_experiment_id", "slotsweep_diagnoses", ["experiment_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_slotsweep_diagnoses_experiment_id", table_name="slotsweep_diagnoses")
    op.drop_table("slotsweep_diagnoses")
    op.drop_table("slotsweep_fusion_choices")
