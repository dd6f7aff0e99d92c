"""pg_search: PostgreSQL full-text search over finished records (an expression GIN index)

Revision ID: 0003_pg_search
Revises: 0002_review
Create Date: 2026-11-30 08:00:00

PostgreSQL only (SQLite has the FTS5 table of 0002_review). An expression index (over the function below)
rather than a stored tsvector column: no model change, nothing for the worker to compute, and the partial predicate keeps the
prompt load cheap (pending records, which have neither reasoning nor content, are not indexed; the same
rule as the FTS5 triggers). synthwatch.review.filters builds its queries with exactly the expression and the
predicate below (PG_TSVECTOR, PG_INDEXED), so the planner can use the index.

CONCURRENTLY is not used: migrations run inside a transaction, and on a new or small database the build
is fast. On a large existing database the build reads every finished record once.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003_pg_search"
down_revision: str | None = "0002_review"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The document of a record: a PL/pgSQL function, not a bare expression, so that its COST can be declared. The
# planner takes to_tsvector as cheap; on kilobytes of reasoning it costs milliseconds, and a plan that walks the
# records in id order computing it for each (instead of asking the index) ran 40 s for a rare prefix at 50k
# records. PL/pgSQL is never inlined, so the declared cost holds. Each argument may be NULL (a field search
# passes only its column).
DOC_FUNCTION = """
CREATE OR REPLACE FUNCTION synthwatch_fts_doc(reasoning text, content text, prompt text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 100000 AS $$
BEGIN
  RETURN to_tsvector('simple'::regconfig, coalesce(reasoning, '') || ' ' || coalesce(content, '') || ' '
                     || coalesce(prompt, ''));
END
$$"""
# Kept identical to synthwatch.review.filters (a test checks it): the index is used only for this exact expression.
PG_TSVECTOR = "synthwatch_fts_doc(reasoning, content, prompt_json)"
PG_INDEXED = "(reasoning IS NOT NULL OR content IS NOT NULL)"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(DOC_FUNCTION)
    op.execute(f"CREATE INDEX ix_record_fts ON record USING gin ({PG_TSVECTOR}) WHERE {PG_INDEXED}")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP INDEX IF EXISTS ix_record_fts")
    op.execute("DROP FUNCTION IF EXISTS synthwatch_fts_doc(text, text, text)")
