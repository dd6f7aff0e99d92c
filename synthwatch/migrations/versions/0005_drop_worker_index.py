"""drop ix_record_worker: every query that needs a worker's claims also knows the run

Revision ID: 0005_drop_worker_index
Revises: 0004_fts_queue
Create Date: 2026-11-30 13:00:00

The index on (worker_id, status) moved twice per record (claimed, finished) for the one query that used it,
the writer's lease renewal, which now also names the run and so reads the run's in-flight records through
ix_record_claim (run_id, status, id), as the dead-claim release already did.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005_drop_worker_index"
down_revision: str | None = "0004_fts_queue"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_record_worker", table_name="record")


def downgrade() -> None:
    op.create_index("ix_record_worker", "record", ["worker_id", "status"], unique=False)
