"""server_metric: what each endpoint's own /metrics said while a run went (vLLM, SGLang)

Revision ID: 0007_server_metrics
Revises: 0006_repair
Create Date: 2026-12-01 17:55:00

One row per endpoint per scrape (every 2 s by default): the server's kind and version, its running and
waiting requests, KV-cache use, preemptions/s, generation and prompt tokens/s, and queue-time and TTFT
quantiles over the interval (from its histograms), or the error that kept the scrape from working.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_server_metrics"
down_revision: str | None = "0006_repair"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "server_metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(), nullable=True),
        sa.Column("version", sa.String(), nullable=True),
        sa.Column("running", sa.Float(), nullable=True),
        sa.Column("waiting", sa.Float(), nullable=True),
        sa.Column("kv_usage", sa.Float(), nullable=True),
        sa.Column("preemptions_s", sa.Float(), nullable=True),
        sa.Column("gen_tokens_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens_s", sa.Float(), nullable=True),
        sa.Column("queue_p50_s", sa.Float(), nullable=True),
        sa.Column("queue_p95_s", sa.Float(), nullable=True),
        sa.Column("ttft_p50_s", sa.Float(), nullable=True),
        sa.Column("ttft_p95_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_server_metric_run", "server_metric", ["run_id", "endpoint", "t"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_server_metric_run", table_name="server_metric")
    op.drop_table("server_metric")
