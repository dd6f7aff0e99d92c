"""open items: what an alarm leaves behind until its records are repaired, excluded or accepted (#26)

Revision ID: 0013_open_items
Revises: 0012_bigint_tokens
Create Date: 2026-12-02 04:30:00

- open_item: one row per (run, check) per opening; state open | repaired | excluded | accepted; its records
  counted from the record table (n_records still failing, n_excluded flagged bad, n_queued
  queued for a re-run, n_peak the most ever
  counted, first_t / last_t their finish times); closed_at / closed_by / reason when it closed; follows: the
  closed item before it on the same check (history is appended, never deleted).
- Runs made before this migration: an open item for every check that had an alarm, counted at the next sync
  (the writer's, a repair, an export from the dashboard, `synthwatch checks RUN`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_open_items"
down_revision: str | None = "0012_bigint_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "open_item",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("check_name", sa.String(), nullable=False),
        sa.Column("alarm_id", sa.Integer(), nullable=True),
        sa.Column("follows", sa.Integer(), nullable=True),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("n_records", sa.Integer(), nullable=False),
        sa.Column("n_excluded", sa.Integer(), nullable=False),
        sa.Column("n_queued", sa.Integer(), nullable=False),
        sa.Column("n_peak", sa.Integer(), nullable=False),
        sa.Column("first_t", sa.Float(), nullable=True),
        sa.Column("last_t", sa.Float(), nullable=True),
        sa.Column("closed_at", sa.Float(), nullable=True),
        sa.Column("closed_by", sa.String(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_open_item_run", "open_item", ["run_id", "state"], unique=False)
    # earlier runs: an item per check that had an alarm (counted from the records at the next sync)
    op.execute(
        "INSERT INTO open_item (run_id, check_name, alarm_id, state, opened_at, updated_at, n_records, n_excluded,"
        " n_queued, n_peak) SELECT run_id, rule, MIN(id), 'open', MIN(raised_at), MAX(updated_at), MAX(count), 0, 0,"
        " MAX(count)"
        " FROM alarm GROUP BY run_id, rule"
    )


def downgrade() -> None:
    op.drop_index("ix_open_item_run", table_name="open_item")
    op.drop_table("open_item")
