"""judge models: what the judge cost, counted apart from the run's own requests (#30)

Revision ID: 0017_judge
Revises: 0016_samples
Create Date: 2026-12-02 12:00:00

- judge_usage: one row per run with a judge: requests sent, failed attempts, verdicts by state, prompt and
  completion tokens; the run's own token counters (series, record) never include the judge's. Its verdicts are
  check_verdict rows (check_name 'judge').
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_judge"
down_revision: str | None = "0016_samples"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "judge_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("failed_attempts", sa.Integer(), nullable=False),
        sa.Column("n_pass", sa.Integer(), nullable=False),
        sa.Column("n_fail", sa.Integer(), nullable=False),
        sa.Column("n_error", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("guided", sa.String(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", name="uq_judge_usage_run"),
    )


def downgrade() -> None:
    op.drop_table("judge_usage")
