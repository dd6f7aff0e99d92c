"""k samples per prompt: each sample a record of its own (#30)

Revision ID: 0016_samples
Revises: 0015_check_verdicts
Create Date: 2026-12-02 11:40:00

- record.prompt_idx: the prompt's position in the dataset (NULL on records made before: their idx is it);
  record.sample_index: which of the prompt's samples_per_prompt samples this record is (0 for the first).
  A run with k samples per prompt stores prompt p's sample s at idx = p * k + s, so (run_id, idx) stays unique
  and a resume claims exactly the samples that are left.
- ix_record_prompt (run_id, prompt_idx): per-prompt progress and export selection group by it.

Plain ADD COLUMN / CREATE INDEX, never a batch alter: on SQLite a batch recreate copies the record table and drops
its full-text triggers (0004_fts_queue; see 0012's note).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_samples"
down_revision: str | None = "0015_check_verdicts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("record", sa.Column("prompt_idx", sa.Integer(), nullable=True))
    op.add_column("record", sa.Column("sample_index", sa.Integer(), server_default="0", nullable=False))
    op.create_index("ix_record_prompt", "record", ["run_id", "prompt_idx"])


def downgrade() -> None:
    op.drop_index("ix_record_prompt", table_name="record")
    with op.batch_alter_table("record") as batch:
        batch.drop_column("sample_index")
        batch.drop_column("prompt_idx")
