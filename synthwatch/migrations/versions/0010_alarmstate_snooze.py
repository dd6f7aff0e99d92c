"""an alarm's snooze and its evidence (#26)

Revision ID: 0010_alarmstate_snooze
Revises: 0009_server_numbers
Create Date: 2026-12-02 04:30:00

- alarm.snooze_until: an acknowledgement "for M minutes" ends at this time (NULL: no time bound);
- alarm.snooze_records: an acknowledgement "for N records" lets claims go on until the run has claimed this
  many records (total - n_pending); NULL: no record bound. Both are read by the claim itself
  (synthwatch.store.queue.claim), in the claim's transaction;
- alarm.evidence_json: what the alarm saw (the fields a field mismatch found, the server's error text), so
  that its message and proposed fix are computed again from the evidence and the run's current settings.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_alarmstate_snooze"
down_revision: str | None = "0009_server_numbers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("alarm") as batch:
        batch.add_column(sa.Column("snooze_until", sa.Float(), nullable=True))
        batch.add_column(sa.Column("snooze_records", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("evidence_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("alarm") as batch:
        batch.drop_column("evidence_json")
        batch.drop_column("snooze_records")
        batch.drop_column("snooze_until")
