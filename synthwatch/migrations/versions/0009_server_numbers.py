"""server_metric: what an operator needs to trust the server's numbers

Revision ID: 0009_server_numbers
Revises: 0008_turns
Create Date: 2026-12-02 05:00:00

Each scrape also keeps: the interval it covers (the first scrape has none), the preemptions counted in it,
queue-time and TTFT means from the histograms' _sum/_count, the quantiles as the buckets resolve them ("below
the first bound" included, as JSON), requests the server aborted or failed, the prefix-cache hit rate, the
server's own estimate of how many requests fit its KV cache, and its waiting requests by reason.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_server_numbers"
down_revision: str | None = "0008_turns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FLOATS = ("interval_s", "preemptions", "queue_mean_s", "ttft_mean_s", "aborted", "errored", "prefix_hit_rate",
           "max_concurrency")
_TEXTS = ("quantiles", "waiting_by_reason")


def upgrade() -> None:
    with op.batch_alter_table("server_metric") as batch:
        for name in _FLOATS:
            batch.add_column(sa.Column(name, sa.Float(), nullable=True))
        for name in _TEXTS:
            batch.add_column(sa.Column(name, sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("server_metric") as batch:
        for name in _FLOATS + _TEXTS:
            batch.drop_column(name)
