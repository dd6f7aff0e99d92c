"""where a running dashboard listens (synthwatch.store.dashboards)

Revision ID: 0011_dashboard_address
Revises: 0010_alarmstate_snooze
Create Date: 2026-12-02 04:30:00

- dashboard: one row per `synthwatch serve` (or demo) while it runs: its address, host and pid. The CLI's
  printed links use it (SYNTHWATCH_DASHBOARD_URL wins); a dashboard removes its row when it stops.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_dashboard_address"
down_revision: str | None = "0010_alarmstate_snooze"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dashboard",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dashboard")
