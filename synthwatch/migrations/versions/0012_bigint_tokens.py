"""token columns widened to BIGINT (#25)

Revision ID: 0012_bigint_tokens
Revises: 0011_dashboard_address
Create Date: 2026-12-02 04:40:00

A 4-byte INTEGER on PostgreSQL refused a reply's prompt_tokens of 3,000,000,000, and the writer retried that
batch forever. The record's (and record_history's) token counts and the time series' token sums are BIGINT
now; a count outside 0..2^31-1 is not stored at all (synthwatch.capture.safety), so the series' sums of a flush
stay far inside the range. SQLite's INTEGER already holds 8 bytes: its tables are rebuilt only for the type name.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_bigint_tokens"
down_revision: str | None = "0011_dashboard_address"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RECORD = ("prompt_tokens", "completion_tokens", "reasoning_tokens")
_SERIES = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "content_tokens")


def _alter(table: str, cols: Sequence[str], nullable: bool, old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    with op.batch_alter_table(table) as batch:
        for c in cols:
            batch.alter_column(c, existing_type=old, type_=new, existing_nullable=nullable)


def upgrade() -> None:
    _alter("record", _RECORD, True, sa.Integer(), sa.BigInteger())
    _alter("record_history", _RECORD, True, sa.Integer(), sa.BigInteger())
    _alter("series", _SERIES, False, sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _alter("series", _SERIES, False, sa.BigInteger(), sa.Integer())
    _alter("record_history", _RECORD, True, sa.BigInteger(), sa.Integer())
    _alter("record", _RECORD, True, sa.BigInteger(), sa.Integer())
