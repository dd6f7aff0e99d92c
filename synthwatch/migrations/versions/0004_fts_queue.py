"""fts_queue: the worker no longer tokenizes text for full-text search; it queues record ids instead

Revision ID: 0004_fts_queue
Revises: 0003_pg_search
Create Date: 2026-11-30 10:00:00

SQLite only. With 0002_review's triggers, every finished record was tokenized into record_fts inside the
worker's write transaction: 0.3-3 ms per record (more for long reasoning), the largest single cost of a
worker's writes. Now whoever writes a record's text also queues its id (record_fts_queue; the worker's
writer in the same transaction), and the index is built outside the worker (synthwatch.store.search_index: in
the background by `serve`, and before a search).

No trigger fires on the record UPDATEs and INSERTs any more, not even one that does nothing: the presence
of a trigger makes SQLite keep a statement journal of every page the statement changes, which tripled the
cost of the worker's final UPDATE (27 -> 64-80 us per record, measured). Only deletes keep triggers.

Invariant (kept by search_index and the delete triggers): a record is in record_fts, with its current text,
exactly when it has a reasoning or a content and its id is not queued. A finished record's text is written
once; code that rewrites it calls search_index.unindex() first (an external-content FTS5 table can only
delete an entry given the text it indexed, and must never be asked to delete an entry it does not hold).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004_fts_queue"
down_revision: str | None = "0003_pg_search"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_TEXT = "({p}.reasoning IS NOT NULL OR {p}.content IS NOT NULL)"
_OLD_INDEXED = ("old.id IN (SELECT id FROM record_fts_docsize)"
                " AND NOT EXISTS (SELECT 1 FROM record_fts_queue WHERE record_id = old.id)")
_DELETE_OLD = ("INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)"
               " VALUES ('delete', old.id, old.prompt_json, old.reasoning, old.content);")

UPGRADE = [
    "DROP TRIGGER IF EXISTS record_fts_ai",
    "DROP TRIGGER IF EXISTS record_fts_ad",
    "DROP TRIGGER IF EXISTS record_fts_au_del",
    "DROP TRIGGER IF EXISTS record_fts_au_ins",
    # WITHOUT ROWID: the record id is the whole row, so the queue is one small b-tree
    "CREATE TABLE record_fts_queue (record_id INTEGER PRIMARY KEY) WITHOUT ROWID",
    # BEFORE runs ahead of the AFTER trigger: the entry is deleted while the queue still says whether the record
    # was indexed
    f"""CREATE TRIGGER record_fts_bd BEFORE DELETE ON record WHEN {_OLD_INDEXED} BEGIN
  {_DELETE_OLD}
END""",
    """CREATE TRIGGER record_fts_ad AFTER DELETE ON record BEGIN
  DELETE FROM record_fts_queue WHERE record_id = old.id;
END""",
]

DOWNGRADE = [
    # index what is queued first, so the old triggers find the table complete
    "INSERT INTO record_fts(rowid, prompt_json, reasoning, content) SELECT r.id, r.prompt_json, r.reasoning,"
    f" r.content FROM record r JOIN record_fts_queue q ON q.record_id = r.id WHERE {_HAS_TEXT.format(p='r')}",
    "DROP TRIGGER IF EXISTS record_fts_bd",
    "DROP TRIGGER IF EXISTS record_fts_ad",
    "DROP TABLE IF EXISTS record_fts_queue",
    f"""CREATE TRIGGER record_fts_ai AFTER INSERT ON record WHEN {_HAS_TEXT.format(p="new")} BEGIN
  INSERT INTO record_fts(rowid, prompt_json, reasoning, content)
  VALUES (new.id, new.prompt_json, new.reasoning, new.content);
END""",
    f"""CREATE TRIGGER record_fts_ad AFTER DELETE ON record WHEN {_HAS_TEXT.format(p="old")} BEGIN
  INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)
  VALUES ('delete', old.id, old.prompt_json, old.reasoning, old.content);
END""",
    f"""CREATE TRIGGER record_fts_au_del AFTER UPDATE OF prompt_json, reasoning, content ON record
WHEN {_HAS_TEXT.format(p="old")} BEGIN
  INSERT INTO record_fts(record_fts, rowid, prompt_json, reasoning, content)
  VALUES ('delete', old.id, old.prompt_json, old.reasoning, old.content);
END""",
    f"""CREATE TRIGGER record_fts_au_ins AFTER UPDATE OF prompt_json, reasoning, content ON record
WHEN {_HAS_TEXT.format(p="new")} BEGIN
  INSERT INTO record_fts(rowid, prompt_json, reasoning, content)
  VALUES (new.id, new.prompt_json, new.reasoning, new.content);
END""",
]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for stmt in UPGRADE:
            op.execute(stmt)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for stmt in DOWNGRADE:
            op.execute(stmt)
