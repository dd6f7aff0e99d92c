"""store: PostgreSQL's full-text document reads a bounded prefix of each long field (#34)

Revision ID: 0019_store
Revises: 0018_live
Create Date: 2026-12-03 14:00:00

A tsvector holds at most 1 MiB (1,048,575 bytes) of lexemes and positions. 0003_pg_search indexed the whole
reasoning, answer and prompt, so a valid answer with a large vocabulary (150,000 distinct numbers, 1 MB) made
PostgreSQL refuse the record's row: the writer recorded it as store_refused and its text was lost, where SQLite
kept it. The document function now reads the first FTS_PREFIX_CHARS characters of each field (docs/limits.md):
at most 6 bytes of tsvector per character of text (a one-character word of a 3-byte letter, its entry, padding,
position count and position), so 3 x 40,000 characters stay under the limit whatever the text. The function keeps
its name and arguments: the index expression and the queries of synthwatch.review.filters are unchanged, and
the index is rebuilt over the new body. PostgreSQL only; SQLite's FTS5 index has no such limit.

The downgrade restores the whole-text document; it fails (and changes nothing) while a record's text makes a
tsvector over 1 MiB, which 0017 cannot index: nothing is deleted to make it pass.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019_store"
down_revision: str | None = "0018_live"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FTS_PREFIX_CHARS = 40_000  # kept equal to synthwatch.store.rows.FTS_PREFIX_CHARS (a test checks it)


def _function(prefix: int | None) -> str:
    def part(col: str) -> str:
        return f"left(coalesce({col}, ''), {prefix})" if prefix else f"coalesce({col}, '')"

    return f"""
CREATE OR REPLACE FUNCTION synthwatch_fts_doc(reasoning text, content text, prompt text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 100000 AS $$
BEGIN
  RETURN to_tsvector('simple'::regconfig, {part('reasoning')} || ' ' || {part('content')} || ' '
                     || {part('prompt')});
END
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_function(FTS_PREFIX_CHARS))
    op.execute("REINDEX INDEX ix_record_fts")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_function(None))
    op.execute("REINDEX INDEX ix_record_fts")
