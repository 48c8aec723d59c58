"""experiment checkpoint key

``slotsweep_experiments.checkpoint_key`` is the random part of the experiment's
checkpoint folder, ``<checkpoint_storage.path>/<id>-<key>/<trial id>/<uuid>``. Experiment
ids count from 1 in every database, so with the id alone two databases used with one
checkpoint path shared ``<path>/1/``, and one's garbage collection could delete what the
other was writing. Experiments created before this revision have none and keep their
``<id>`` folder (every checkpoint row records its full path as well).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 14:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_experiments") as batch:
        batch.add_column(sa.Column("checkpoint_key", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("slotsweep_experiments") as batch:
        batch.drop_column("checkpoint_key")
