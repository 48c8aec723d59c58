"""slot shares

A trial may hold a share of one slot (``resources.slots_per_trial`` 0.5, 0.25 or 0.125),
so several claims may sit on one slot. ``slotsweep_allocations.eighths`` is how much of
its slot a claim holds, in eighths (8: the whole slot, every row written before this
revision); ``slotsweep_queue.eighths`` the same for a waiting trial. The unique key on
(pool, agent, slot) becomes unique for whole-slot claims only (a partial index): two
whole claims of one slot still collide in the database itself, and shares are admitted
by the claiming transaction under the ledger's lock while the slot's claims add up to
at most one slot. A plain index on (pool, agent, slot) serves the per-slot lookups the
unique key served before.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_WHOLE = sa.text("eighths = 8")


def upgrade() -> None:
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.add_column(sa.Column("eighths", sa.Integer(), nullable=False, server_default="8"))
        batch.drop_constraint("uq_slot", type_="unique")
        batch.create_index(
            "uq_slot_whole",
            ["resource_pool", "agent", "slot"],
            unique=True,
            sqlite_where=_WHOLE,
            postgresql_where=_WHOLE,
        )
        batch.create_index("ix_slotsweep_allocations_slot", ["resource_pool", "agent", "slot"])
    with op.batch_alter_table("slotsweep_queue") as batch:
        batch.add_column(sa.Column("eighths", sa.Integer(), nullable=False, server_default="8"))


def downgrade() -> None:
    # Only whole-slot claims fit the old key: shares are released first (their trials
    # wait again, as after a resume).
    op.execute("DELETE FROM slotsweep_allocations WHERE eighths <> 8")
    op.execute("DELETE FROM slotsweep_queue WHERE eighths <> 8")
    with op.batch_alter_table("slotsweep_queue") as batch:
        batch.drop_column("eighths")
    with op.batch_alter_table("slotsweep_allocations") as batch:
        batch.drop_index("ix_slotsweep_allocations_slot")
        batch.drop_index("uq_slot_whole")
        batch.create_unique_constraint("uq_slot", ["resource_pool", "agent", "slot"])
        batch.drop_column("eighths")
