"""multi-turn regeneration: a record's turns (synthwatch.capture.turns)

Revision ID: 0008_turns
Revises: 0007_server_metrics
Create Date: 2026-12-01 18:10:00

- record.n_turns: the turns the model writes for the conversation (1 unless the run has turns = "all");
  record.turns_done: turns finished and stored; record.turns_json: the finished turns before the last,
  each with its reasoning, content, token ids, attempts (the last turn is the record's own columns).
- record_history.turns_json / turns_done: a re-run keeps the earlier turns of the conversation too.
- run.n_turns / n_turns_done: progress in turns (0 for runs made before: their records count one turn).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_turns"
down_revision: str | None = "0007_server_metrics"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("record") as batch:
        batch.add_column(sa.Column("n_turns", sa.Integer(), server_default="1", nullable=False))
        batch.add_column(sa.Column("turns_done", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("turns_json", sa.Text(), nullable=True))
    with op.batch_alter_table("record_history") as batch:
        batch.add_column(sa.Column("turns_json", sa.Text(), nullable=True))
        batch.add_column(sa.Column("turns_done", sa.Integer(), nullable=True))
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("n_turns", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("n_turns_done", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("run") as batch:
        batch.drop_column("n_turns_done")
        batch.drop_column("n_turns")
    with op.batch_alter_table("record_history") as batch:
        batch.drop_column("turns_done")
        batch.drop_column("turns_json")
    with op.batch_alter_table("record") as batch:
        batch.drop_column("turns_json")
        batch.drop_column("turns_done")
        batch.drop_column("n_turns")
