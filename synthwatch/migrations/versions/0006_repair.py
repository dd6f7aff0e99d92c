"""repair loop: config versions, record history, repairs, auto-pause overrides, alarm snoozes

Revision ID: 0006_repair
Revises: 0005_drop_worker_index
Create Date: 2026-12-01 17:30:00

- config_version: every change of a run's settings is a new row (version 1 is the run's first config);
  run.config_json stays the current version's snapshot, which every reader already uses.
- record.gen_version / derive_version: the config version a record was generated and last derived under;
  record.revision counts its earlier outputs, kept whole in record_history (append-only);
  record.rerun marks a record queued again (run.n_rerun counts those not finished yet).
- repair: one row per re-derive / re-run / undo, with who, when and what was selected.
- pause_override: auto-pause turned off for one check of a run, with a typed reason, until turned on again.
- alarm.acked_by, alarm.reraised_from: an acknowledgement is a snooze; a condition that comes back raises a
  new alarm row that points at the acknowledged one.
- run.repair_seq: bumped by every repair, so running workers reload their check state.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_repair"
down_revision: str | None = "0005_drop_worker_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OUTPUT_COLS = (
    ("status", sa.String()), ("reasoning", sa.Text()), ("content", sa.Text()), ("content_null", sa.Boolean()),
    ("reasoning_source", sa.String()), ("reasoning_len", sa.Integer()), ("content_len", sa.Integer()),
    ("finish_reason", sa.String()), ("prompt_tokens", sa.Integer()), ("completion_tokens", sa.Integer()),
    ("reasoning_tokens", sa.Integer()), ("usage_json", sa.Text()), ("token_ids_json", sa.Text()),
    ("latency_s", sa.Float()), ("ttft_s", sa.Float()), ("n_chunks", sa.Integer()), ("attempts", sa.Integer()),
    ("attempts_json", sa.Text()), ("error_kind", sa.String()), ("error", sa.Text()), ("endpoint", sa.String()),
    ("model", sa.String()), ("system_fingerprint", sa.String()), ("response_id", sa.String()),
    ("extra_json", sa.Text()), ("finished_at", sa.Float()), ("check_flags", sa.Integer()),
    ("check_json", sa.Text()), ("gen_version", sa.Integer()), ("derive_version", sa.Integer()),
)


def upgrade() -> None:
    op.create_table(
        "config_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("changes_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "version", name="uq_config_version"),
    )
    op.create_table(
        "repair",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("selection", sa.Text(), nullable=False),
        sa.Column("config_version", sa.Integer(), nullable=False),
        sa.Column("n_selected", sa.Integer(), nullable=False),
        sa.Column("n_changed", sa.Integer(), nullable=False),
        sa.Column("n_skipped", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("summary_json", sa.Text(), nullable=True),
        sa.Column("undone_at", sa.Float(), nullable=True),
        sa.Column("undo_of", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_repair_run", "repair", ["run_id", "id"], unique=False)
    op.create_table(
        "record_history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("record_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("repair_id", sa.Integer(), nullable=True),
        *[sa.Column(name, type_, nullable=True) for name, type_ in _OUTPUT_COLS],
        sa.ForeignKeyConstraint(["record_id"], ["record.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_record_history_record", "record_history", ["record_id", "revision"], unique=False)
    op.create_index("ix_record_history_repair", "record_history", ["repair_id"], unique=False)
    op.create_table(
        "pause_override",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("check_name", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("ended_by", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_pause_override_run", "pause_override", ["run_id", "check_name"], unique=False)
    with op.batch_alter_table("record") as batch:
        batch.add_column(sa.Column("gen_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("derive_version", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("rerun", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("run") as batch:
        batch.add_column(sa.Column("config_version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("n_rerun", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("repair_seq", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("alarm") as batch:
        batch.add_column(sa.Column("acked_by", sa.String(), nullable=True))
        batch.add_column(sa.Column("reraised_from", sa.Integer(), nullable=True))
    # every existing run gets its version 1 from the config it stored
    op.execute(
        "INSERT INTO config_version (run_id, version, created_at, actor, reason, config_json, changes_json)"
        " SELECT id, 1, created_at, 'migration', NULL, config_json, '[]' FROM run"
    )
    op.execute("UPDATE record SET gen_version = 1, derive_version = 1 WHERE status IN ('ok', 'error', 'timeout')")


def downgrade() -> None:
    with op.batch_alter_table("alarm") as batch:
        batch.drop_column("reraised_from")
        batch.drop_column("acked_by")
    with op.batch_alter_table("run") as batch:
        batch.drop_column("repair_seq")
        batch.drop_column("n_rerun")
        batch.drop_column("config_version")
    with op.batch_alter_table("record") as batch:
        batch.drop_column("rerun")
        batch.drop_column("revision")
        batch.drop_column("derive_version")
        batch.drop_column("gen_version")
    op.drop_index("ix_pause_override_run", table_name="pause_override")
    op.drop_table("pause_override")
    op.drop_index("ix_record_history_repair", table_name="record_history")
    op.drop_index("ix_record_history_record", table_name="record_history")
    op.drop_table("record_history")
    op.drop_index("ix_repair_run", table_name="repair")
    op.drop_table("repair")
    op.drop_table("config_version")
