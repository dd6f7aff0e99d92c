"""logprobs: a record's completion logprobs, packed (#38 item 5)

Revision ID: 0021_logprobs38
Revises: 0020_detection
Create Date: 2026-12-03 16:45:00

- record.logprobs_json: choices[0].logprobs of the reply (sampling.logprobs / top_logprobs), one int32 id and one
  float16 logprob per completion token and k alternatives each, base64 in a small JSON object
  (synthwatch.capture.logprobs); NULL when the run did not ask for them. Bounded by limits.max_logprobs_bytes.
- record_history.logprobs_json: the same, in the output a repair replaced.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_logprobs38"
down_revision: str | None = "0020_detection"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("record", "record_history"):  # a repair keeps the output it replaces whole, logprobs too
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("logprobs_json", sa.Text(), nullable=True))


def downgrade() -> None:
    for table in ("record_history", "record"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("logprobs_json")
