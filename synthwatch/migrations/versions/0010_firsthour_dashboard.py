"""where a running dashboard listens (synthwatch.store.dashboards)

Revision ID: 0010_firsthour_dashboard
Revises: 0009_server_numbers
Create Date: 2026-12-02 04:30:00

- dashboard: one row per `synthwatch serve` (or demo) while it runs: its address, host and pid. The CLI's
  printed links use it (SYNTHWATCH_DASHBOARD_URL wins); a dashboard removes its row when it stops.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_firsthour_dashboard"
down_revision: str | None = "0009_server_numbers"
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
