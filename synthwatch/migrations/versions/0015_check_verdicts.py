"""check verdicts: the extended checks' per-record verdicts, written after the record (#30)

Revision ID: 0015_check_verdicts
Revises: 0014_counted_tokens
Create Date: 2026-12-02 11:40:00

- check_verdict: one row per verdict of an extended check (verifiers, user checks, TOML rules, language,
  near-duplicates, judges) on one record. History is appended: the latest row per (record_id, check_name) by id
  is the verdict in force; a 'pending' row (or no row at all) means the check has not answered yet.
  state: pending | pass | fail | error; reason is bounded (500 characters) and escaped on display.
- Indexes: (run_id, check_name, state) for rates and pending counts, (record_id, check_name, id) for the latest
  verdict of one record.
- record.row_json (TEXT NULL): the dataset row's fields the extended checks read (a verifier's reference field),
  as a JSON object, kept with the record so a verdict can be recomputed later. Added with a plain ADD COLUMN,
  never a batch-alter: SQLite's table copy would drop the FTS triggers (see 0012's note).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_check_verdicts"
down_revision: str | None = "0014_counted_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "check_verdict",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("record_id", sa.Integer(), nullable=False),
        sa.Column("check_name", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("cost_ms", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.ForeignKeyConstraint(["record_id"], ["record.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_check_verdict_run_id", "check_verdict", ["run_id"], unique=False)
    op.create_index("ix_check_verdict_state", "check_verdict", ["run_id", "check_name", "state"], unique=False)
    op.create_index("ix_check_verdict_record", "check_verdict", ["record_id", "check_name", "id"], unique=False)
    op.add_column("record", sa.Column("row_json", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("record", "row_json")
    op.drop_index("ix_check_verdict_record", table_name="check_verdict")
    op.drop_index("ix_check_verdict_state", table_name="check_verdict")
    op.drop_index("ix_check_verdict_run_id", table_name="check_verdict")
    op.drop_table("check_verdict")
