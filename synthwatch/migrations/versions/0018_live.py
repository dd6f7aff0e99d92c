"""live streams: what a pause does to the requests in flight, and the workers' snapshots of their streams (#36)

Revision ID: 0018_live
Revises: 0017_judge
Create Date: 2026-12-03 13:30:00

- run.pause_in_flight: what the last pause asked of the requests in flight: 'cancel' (closed, records back to
  pending) or 'finish'; NULL: the check that paused the run says (a doomed output is cancelled, a repairable one
  finishes).
- worker.streams_json / streams_at: the worker's bounded snapshot of its streams in flight (record, endpoint, age,
  tokens, the last characters of reasoning and content), written by its writer every live_streams_refresh_ms.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_live"
down_revision: str | None = "0017_judge"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("pause_in_flight", sa.String(), nullable=True))
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("streams_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("streams_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("streams_at")
        batch.drop_column("streams_json")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("pause_in_flight")
