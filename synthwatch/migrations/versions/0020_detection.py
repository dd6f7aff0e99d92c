"""detection: hysteresis state shared by every worker, and the append-only history of weakening overrides (#35)

Revision ID: 0020_detection
Revises: 0019_store
Create Date: 2026-12-03 13:30:00

- check_stat.pending_from / clear_from: the run's count of records checked (n_total) when a rule's condition
  began to hold without an alarm (pending), or stopped holding under an open alarm (clearing). In the database,
  so a restarted worker and every worker of the run see the same hysteresis (synthwatch.quality.detection).
- check_override: every setting change that makes fewer records fail or stops a check from pausing, with its
  reason, who and when. Rows are only appended.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_detection"
down_revision: str | None = "0019_store"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("check_stat") as batch:
        batch.add_column(sa.Column("pending_from", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("clear_from", sa.Integer(), nullable=True))
    op.create_table(
        "check_override",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("check_name", sa.String(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_check_override_run", "check_override", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_check_override_run", table_name="check_override")
    op.drop_table("check_override")
    with op.batch_alter_table("check_stat") as batch:
        batch.drop_column("clear_from")
        batch.drop_column("pending_from")
