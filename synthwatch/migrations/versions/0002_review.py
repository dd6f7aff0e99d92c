"""review: full-text search over records (SQLite FTS5) and the indexes behind sampling and filters

Revision ID: 0002_review
Revises: 0001_initial
Create Date: 2026-11-30 07:00:00

Why these indexes (1M records, each row carrying kilobytes of reasoning in overflow pages: any filter that
has to read a column from the table row is slow, so every filter and sampling mode is answered from an
index):

- ix_record_review (run_id, status, review, rnd): random "not yet reviewed" / "flagged" samples in O(log n).
- ix_record_failing (run_id, status, rnd, check_flags) WHERE check_flags != 0: random "failing a check"
  samples; check_flags is included so a single check's bit is tested without touching the row.
- ix_record_filter (run_id, id, <every filter column>): a narrow copy of the filterable columns in id
  order. The records table walks it newest-first, evaluates every filter inside the index and stops after
  one page, so a page never reads a record row it does not show.

The FTS5 table indexes only records that have a reasoning or a content (finished ones): indexing the
1M prompts of a fresh run at load time would cost ~90 us each. Triggers keep it in sync with the
worker's final UPDATE (0004_fts_queue moves the indexing out of the worker). Never run FTS5's 'rebuild' on
it (that would index pending rows too): use synthwatch.store.search_index.rebuild().
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_review"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FILTER_COLUMNS = [
    "run_id", "id", "status", "finish_reason", "review", "review_reason", "reasoning_source", "endpoint",
    "check_flags", "reasoning_len", "content_len", "completion_tokens", "latency_s",
]

_INDEXED = "({p}.reasoning IS NOT NULL OR {p}.content IS NOT NULL)"
FTS_SQL = [
    "CREATE VIRTUAL TABLE record_fts USING fts5("
    "prompt_json, reasoning, content, content='record', content_rowid='id')",
    f"""CREATE TRIGGER record_fts_ai AFTER INSERT ON record WHEN {_INDEXED.format(p="new")} BEGIN
  INSERT INTO record_fts(rowid, prompt_json, reasoning, content)
  VALUES (new.id, new.prompt_json, new.reasoning, new.content);
END""",
    f"""CREATE TRIGGER record_fts_ad AFTER DELETE ON record WHEN {_INDEXED.format(p="old")} BEGIN
  INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)
  VALUES ('delete', old.id, old.prompt_json, old.reasoning, old.content);
END""",
    f"""CREATE TRIGGER record_fts_au_del AFTER UPDATE OF prompt_json, reasoning, content ON record
WHEN {_INDEXED.format(p="old")} BEGIN
  INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)
  VALUES ('delete', old.id, old.prompt_json, old.reasoning, old.content);
END""",
    f"""CREATE TRIGGER record_fts_au_ins AFTER UPDATE OF prompt_json, reasoning, content ON record
WHEN {_INDEXED.format(p="new")} BEGIN
  INSERT INTO record_fts(rowid, prompt_json, reasoning, content)
  VALUES (new.id, new.prompt_json, new.reasoning, new.content);
END""",
    # records finished before this migration
    "INSERT INTO record_fts(rowid, prompt_json, reasoning, content) SELECT id, prompt_json, reasoning, content"
    f" FROM record WHERE {_INDEXED.format(p='record')}",
]


def upgrade() -> None:
    with op.batch_alter_table("record", schema=None) as batch_op:
        batch_op.create_index("ix_record_review", ["run_id", "status", "review", "rnd"], unique=False)
        batch_op.create_index(
            "ix_record_failing", ["run_id", "status", "rnd", "check_flags"], unique=False,
            sqlite_where=sa.text("check_flags != 0"), postgresql_where=sa.text("check_flags != 0"),
        )
        batch_op.create_index("ix_record_filter", FILTER_COLUMNS, unique=False)
    if op.get_bind().dialect.name == "sqlite":
        for stmt in FTS_SQL:
            op.execute(stmt)
    # PostgreSQL: full-text search (tsvector) comes with a later migration.


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("record_fts_ai", "record_fts_ad", "record_fts_au_del", "record_fts_au_ins"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS record_fts")
    with op.batch_alter_table("record", schema=None) as batch_op:
        batch_op.drop_index("ix_record_filter")
        batch_op.drop_index("ix_record_failing")
        batch_op.drop_index("ix_record_review")
