"""reasoning tokens counted from ids, where each count comes from, and the tokens billed for every attempt (#29)

Revision ID: 0014_counted_tokens
Revises: 0013_open_items
Create Date: 2026-12-02 11:40:00

- record.reasoning_tokens_source (and record_history's): ids | usage | none | estimate
  (synthwatch.capture.token_count.reasoning_count); NULL on records written before, whose count was the server's
  usage.
- series.reasoning_estimated: the part of a bucket's reasoning_tokens that is a text-length estimate.
- series.billed_prompt_tokens / billed_completion_tokens / billed_estimated: the tokens of every attempt that
  finished in the bucket, ok or failed (a provider bills a timed-out stream's tokens), and the part of them
  counted by synthwatch (not from usage); record (and record_history) billed_*: the same over a record's attempts.

Plain ADD COLUMN (no batch alter): on SQLite a batch alter copies the record table and drops its full-text
delete triggers (0012_bigint_tokens).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_counted_tokens"
down_revision: str | None = "0013_open_items"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOKENS = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_BILLED = ("billed_prompt_tokens", "billed_completion_tokens", "billed_estimated")


def upgrade() -> None:
    op.add_column("record", sa.Column("reasoning_tokens_source", sa.String(), nullable=True))
    op.add_column("record_history", sa.Column("reasoning_tokens_source", sa.String(), nullable=True))
    op.add_column("series", sa.Column("reasoning_estimated", _TOKENS, nullable=False, server_default="0"))
    for col in _BILLED:
        op.add_column("series", sa.Column(col, _TOKENS, nullable=False, server_default="0"))
        op.add_column("record", sa.Column(col, _TOKENS, nullable=True))
        op.add_column("record_history", sa.Column(col, _TOKENS, nullable=True))


def downgrade() -> None:
    for col in _BILLED:
        for table in ("record_history", "record", "series"):
            op.drop_column(table, col)
    op.drop_column("series", "reasoning_estimated")
    op.drop_column("record_history", "reasoning_tokens_source")
    op.drop_column("record", "reasoning_tokens_source")
