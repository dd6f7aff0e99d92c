"""The schema, as SQLModel tables.

Alembic migrations in ``synthwatch/migrations`` are the only schema source at run time; a test
checks that these models and the migrations agree. Timestamps are Unix seconds (float): cheap
to compare, bucket and serialise on both SQLite and PostgreSQL. JSON payloads are stored as
text produced by orjson so the worker's hot path never builds ORM objects.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

from .statuses import (  # noqa: F401 - re-exported: the statuses live where the worker can import them cheaply
    DESIRED_STATES,
    FINISHED_STATUSES,
    LIVE_STATUSES,
    RECORD_STATUSES,
    RUN_STATUSES,
)


def _text(nullable: bool = True) -> Column:  # type: ignore[type-arg]
    return Column(Text, nullable=nullable)



# token counts: BIGINT, except on SQLite, whose INTEGER is 8 bytes (re-typing it there would copy the record table)
TOKENS = BigInteger().with_variant(Integer(), "sqlite")

class RecordOutput(SQLModel):
    """What a record's answer is: the columns a record and each of its history rows share (nullable in both)."""

    reasoning: str | None = Field(default=None, sa_type=Text)
    content: str | None = Field(default=None, sa_type=Text)
    reasoning_source: str | None = None
    reasoning_len: int | None = None
    content_len: int | None = None
    finish_reason: str | None = None
    # BIGINT on PostgreSQL (migration 0012_bigint_tokens): no server value may fail a write; counts outside 0..2^31-1
    # are not stored at all. SQLite's INTEGER holds 8 bytes already (TOKENS: the same column, altered nowhere)
    prompt_tokens: int | None = Field(default=None, sa_type=TOKENS)
    completion_tokens: int | None = Field(default=None, sa_type=TOKENS)
    reasoning_tokens: int | None = Field(default=None, sa_type=TOKENS)
    # where reasoning_tokens comes from: ids | usage | none | estimate (capture.token_count.reasoning_count);
    # NULL on records written before 0016 (their count is the server's usage)
    reasoning_tokens_source: str | None = None
    usage_json: str | None = Field(default=None, sa_type=Text)
    token_ids_json: str | None = Field(default=None, sa_type=Text)
    latency_s: float | None = None
    ttft_s: float | None = None
    n_chunks: int | None = None
    attempts_json: str | None = Field(default=None, sa_type=Text)
    error_kind: str | None = None
    error: str | None = Field(default=None, sa_type=Text)
    endpoint: str | None = None
    model: str | None = None
    system_fingerprint: str | None = None
    response_id: str | None = None
    extra_json: str | None = Field(default=None, sa_type=Text)
    finished_at: float | None = None
    check_json: str | None = Field(default=None, sa_type=Text)
    gen_version: int | None = None  # config version the output was generated under
    derive_version: int | None = None  # config version the output was last derived (read) under
    turns_json: str | None = Field(default=None, sa_type=Text)  # turns = all: the finished turns before the last
    # tokens billed for every attempt of the output (failed, timed-out and retried ones too; the estimated part
    # counted by us, not from usage): capture.token_count.billed_tokens. NULL before 0016 and on imported records
    billed_prompt_tokens: int | None = Field(default=None, sa_type=TOKENS)
    billed_completion_tokens: int | None = Field(default=None, sa_type=TOKENS)
    billed_estimated: int | None = Field(default=None, sa_type=TOKENS)
    # choices[0].logprobs packed (synthwatch.capture.logprobs; migration 0021): NULL unless sampling.logprobs
    logprobs_json: str | None = Field(default=None, sa_type=Text)


class Run(SQLModel, table=True):
    __tablename__ = "run"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    kind: str = Field(default="generate")  # generate | watch
    status: str = Field(default="created")
    desired: str = Field(default="run")  # what the user asked for; workers converge to it
    status_message: str | None = Field(default=None, sa_column=_text())
    cap: int | None = None
    concurrency: int = 1
    config_json: str = Field(default="{}", sa_column=_text(False))
    expects_reasoning: bool = True
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float = 0.0
    total: int = 0
    n_pending: int = 0
    n_in_flight: int = 0
    n_ok: int = 0
    n_error: int = 0
    n_timeout: int = 0
    n_cancelled: int = 0
    config_version: int = Field(default=1, sa_column_kwargs={"server_default": "1"})  # current config_version
    n_rerun: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # re-runs queued, not finished
    repair_seq: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # bumped by every repair
    n_turns: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # turns of all records (0: old run)
    n_turns_done: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # turns finished and stored
    # what the last pause asked of the requests in flight: cancel | finish; NULL: the pausing check says (#36)
    pause_in_flight: str | None = None


class Record(RecordOutput, table=True):
    __tablename__ = "record"
    __table_args__ = (
        UniqueConstraint("run_id", "idx", name="uq_record_run_idx"),
        Index("ix_record_claim", "run_id", "status", "id"),
        Index("ix_record_sample", "run_id", "status", "rnd"),
        Index("ix_record_finished", "run_id", "finished_at"),
        # review (migration 0002_review): sampling modes and the records table are answered from indexes
        Index("ix_record_review", "run_id", "status", "review", "rnd"),
        Index("ix_record_failing", "run_id", "status", "rnd", "check_flags",
              sqlite_where=text("check_flags != 0"), postgresql_where=text("check_flags != 0")),
        Index("ix_record_filter", "run_id", "id", "status", "finish_reason", "review", "review_reason",
              "reasoning_source", "endpoint", "check_flags", "reasoning_len", "content_len", "completion_tokens",
              "latency_s"),
        Index("ix_record_prompt", "run_id", "prompt_idx"),  # samples per prompt (migration 0016_samples)
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    idx: int  # position in the source dataset (stable across resumes); with k samples per prompt: prompt * k + sample
    source_id: str | None = None
    source_line: int | None = None
    rnd: float = 0.0  # uniform random key, indexed, for fast random sampling
    prompt_json: str = Field(sa_column=_text(False))
    status: str = Field(default="pending")
    content_null: bool = False
    attempts: int = 0
    worker_id: int | None = None
    lease_until: float | None = None
    claimed_at: float | None = None
    check_flags: int = 0  # bitmask of failed checks (synthwatch.quality.checks)
    review: str | None = None  # good | bad (latest, denormalised from the flag table)
    review_reason: str | None = None
    reviewed_at: float | None = None
    revision: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # earlier outputs in history
    rerun: int = Field(default=0, sa_column_kwargs={"server_default": "0"})  # 1 while queued again
    # multi-turn regeneration (synthwatch.capture.turns, migration 0008_turns): the turns the model writes for this
    # conversation, how many are finished and stored, and the finished ones before the last (JSON list)
    n_turns: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    turns_done: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # k samples per prompt (migration 0016_samples): the prompt's dataset position (NULL on older records, whose idx
    # is it) and which of its samples this record is; idx = prompt_idx * samples_per_prompt + sample_index
    prompt_idx: int | None = None
    sample_index: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # the dataset row's fields the extended checks read (a verifier's reference), JSON object (migration 0014)
    row_json: str | None = Field(default=None, sa_type=Text)


class Series(SQLModel, table=True):
    """Per-interval counters, one row per (run, worker, endpoint, bucket): charts never scan records."""

    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("run_id", "worker_id", "endpoint", "t", name="uq_series_key"),
        Index("ix_series_run_t", "run_id", "t"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    worker_id: int = 0
    endpoint: str = ""
    t: int  # bucket start, Unix seconds
    width_s: int = 5
    finished: int = 0  # records that reached a final state in this bucket
    ok: int = 0
    errors: int = 0  # records that ended in error
    timeouts: int = 0  # records that ended in timeout
    attempts_failed: int = 0  # failed attempts, retried or not
    attempt_timeouts: int = 0
    retries: int = 0
    dropped: int = 0
    http_429: int = 0
    http_4xx: int = 0
    http_5xx: int = 0
    other_errors: int = 0
    cancelled: int = 0
    prompt_tokens: int = Field(default=0, sa_type=TOKENS)
    completion_tokens: int = Field(default=0, sa_type=TOKENS)
    reasoning_tokens: int = Field(default=0, sa_type=TOKENS)
    content_tokens: int = Field(default=0, sa_type=TOKENS)
    reasoning_estimated: int = Field(default=0, sa_type=TOKENS, sa_column_kwargs={"server_default": "0"})  # part of reasoning_tokens estimated from text
    # tokens billed for every attempt that finished in this bucket, ok or failed (prompt_tokens/completion_tokens:
    # ok records only), and the part of them we counted (estimated) rather than read from usage
    billed_prompt_tokens: int = Field(default=0, sa_type=TOKENS, sa_column_kwargs={"server_default": "0"})
    billed_completion_tokens: int = Field(default=0, sa_type=TOKENS, sa_column_kwargs={"server_default": "0"})
    billed_estimated: int = Field(default=0, sa_type=TOKENS, sa_column_kwargs={"server_default": "0"})
    chunks: int = 0
    empty_reasoning: int = 0
    finish_length: int = 0
    inflight: int = 0
    concurrency: int = 0
    latency_sum: float = 0.0
    lat_hist: str = Field(default="", sa_column=_text(False))
    ttft_hist: str = Field(default="", sa_column=_text(False))
    tps_hist: str = Field(default="", sa_column=_text(False))
    sources_json: str = Field(default="{}", sa_column=_text(False))


class ControlEvent(SQLModel, table=True):
    """Audit log: every control action with its time and who asked."""

    __tablename__ = "control_event"
    __table_args__ = (Index("ix_control_event_run", "run_id", "t"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    t: float
    action: str
    value: str | None = None
    actor: str = "cli"
    detail: str | None = Field(default=None, sa_column=_text())


class ErrorEvent(SQLModel, table=True):
    """Each failed attempt, for the latest-errors list."""

    __tablename__ = "error_event"
    __table_args__ = (Index("ix_error_event_run", "run_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    t: float
    record_id: int | None = None
    endpoint: str | None = None
    kind: str
    status_code: int | None = None
    final: bool = False
    message: str = Field(default="", sa_column=_text(False))


class Worker(SQLModel, table=True):
    __tablename__ = "worker"
    __table_args__ = (Index("ix_worker_run", "run_id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    status: str = "running"  # running | exited
    claimed: int = 0
    done: int = 0
    stats_json: str = Field(default="{}", sa_column=_text(False))
    # the worker's bounded snapshot of its streams in flight, and when it was written (#36, workers/inflight.py)
    streams_json: str | None = Field(default=None, sa_column=_text())
    streams_at: float | None = None


class CheckStat(SQLModel, table=True):
    """Run-level rates per check: whole run and the rolling window, kept live by the writer."""

    __tablename__ = "check_stat"
    __table_args__ = (UniqueConstraint("run_id", "check_name", name="uq_check_stat"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    check_name: str
    n_fail: int = 0
    n_total: int = 0
    win_fail: int = 0
    win_total: int = 0
    example_record_id: int | None = None
    updated_at: float = 0.0
    # hysteresis (synthwatch.quality.detection): n_total when the rule's condition began to hold with no alarm
    # (pending), or stopped holding under an open alarm (clearing)
    pending_from: int | None = None
    clear_from: int | None = None


class Alarm(SQLModel, table=True):
    __tablename__ = "alarm"
    __table_args__ = (Index("ix_alarm_run", "run_id", "active"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    rule: str
    severity: str = "error"  # error | warning
    title: str
    message: str = Field(sa_column=_text(False))
    fix: str | None = Field(default=None, sa_column=_text())
    count: int = 0
    example_record_id: int | None = None
    raised_at: float
    updated_at: float
    acked_at: float | None = None
    acked_by: str | None = None
    active: bool = True
    auto_paused: bool = False
    reraised_from: int | None = None  # the acknowledged alarm whose condition came back
    snooze_until: float | None = None  # an acknowledgement "for M minutes" ends here (read by the claim)
    snooze_records: int | None = None  # ... "for N records": claims stop once the run claimed this many
    evidence_json: str | None = Field(default=None, sa_type=Text)  # what the alarm saw (fields, error text)


class Flag(SQLModel, table=True):
    """Review verdicts with history (undo marks a row undone instead of deleting it)."""

    __tablename__ = "flag"
    __table_args__ = (Index("ix_flag_record", "record_id"), Index("ix_flag_run", "run_id", "created_at"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    record_id: int = Field(foreign_key="record.id")
    verdict: str  # good | bad
    reason: str | None = None
    note: str | None = Field(default=None, sa_column=_text())
    created_at: float
    undone_at: float | None = None
    bulk_id: str | None = None


class IngestSource(SQLModel, table=True):
    """A file followed by `synthwatch watch` (or imported): where to resume reading."""

    __tablename__ = "ingest_source"
    __table_args__ = (UniqueConstraint("run_id", "path", name="uq_ingest_source"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    path: str
    dev: int | None = None
    inode: int | None = None
    offset: int = 0
    line_no: int = 0
    size: int = 0
    shape: str | None = None
    n_ingested: int = 0
    n_bad: int = 0
    updated_at: float = 0.0


class IngestError(SQLModel, table=True):
    __tablename__ = "ingest_error"
    __table_args__ = (Index("ix_ingest_error_run", "run_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    path: str
    line: int
    reason: str = Field(sa_column=_text(False))
    sample: str | None = Field(default=None, sa_column=_text())
    t: float


class ExportJob(SQLModel, table=True):
    __tablename__ = "export_job"
    __table_args__ = (Index("ix_export_job_run", "run_id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    format: str
    out_path: str
    status: str = "running"  # running | done | failed
    done: int = 0
    total: int = 0
    started_at: float
    finished_at: float | None = None
    manifest_json: str | None = Field(default=None, sa_column=_text())
    error: str | None = Field(default=None, sa_column=_text())


class ConfigVersion(SQLModel, table=True):
    """Every version of a run's settings; run.config_json is the current one's snapshot."""

    __tablename__ = "config_version"
    __table_args__ = (UniqueConstraint("run_id", "version", name="uq_config_version"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    version: int
    created_at: float
    actor: str
    reason: str | None = Field(default=None, sa_column=_text())
    config_json: str = Field(sa_column=_text(False))
    changes_json: str = Field(sa_column=_text(False))  # [{"path", "old", "new"}] against the version before


class Repair(SQLModel, table=True):
    """One re-derive, re-run or undo over a selection of a run's records."""

    __tablename__ = "repair"
    __table_args__ = (Index("ix_repair_run", "run_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    kind: str  # rederive | rerun | undo
    t: float
    actor: str
    selection: str = Field(sa_column=_text(False))  # what was selected, in words and as JSON
    config_version: int
    n_selected: int
    n_changed: int
    n_skipped: int
    status: str  # running | done | failed
    summary_json: str | None = Field(default=None, sa_column=_text())
    undone_at: float | None = None
    undo_of: int | None = None


class RecordHistory(RecordOutput, table=True):
    """An earlier output of a record, copied whole before a repair replaced it (append-only)."""

    __tablename__ = "record_history"
    __table_args__ = (Index("ix_record_history_record", "record_id", "revision"),
                      Index("ix_record_history_repair", "repair_id"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int
    record_id: int = Field(foreign_key="record.id")
    revision: int
    t: float
    action: str  # rederive | rerun | undo: what replaced this output
    repair_id: int | None = None
    status: str | None = None
    content_null: bool | None = None
    attempts: int | None = None
    check_flags: int | None = None
    turns_done: int | None = None  # record.turns_done of this output (the turns themselves: turns_json)


class PauseOverride(SQLModel, table=True):
    """Auto-pause turned off for one check of a run (with a reason) until ended_at."""

    __tablename__ = "pause_override"
    __table_args__ = (Index("ix_pause_override_run", "run_id", "check_name"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    check_name: str
    reason: str = Field(sa_column=_text(False))
    actor: str
    created_at: float
    ended_at: float | None = None
    ended_by: str | None = None


class CheckOverride(SQLModel, table=True):
    """A setting change that weakens detection (a check disabled, a threshold raised...), with its reason, who and
    when: appended, never changed (synthwatch.quality.detection.overrides)."""

    __tablename__ = "check_override"
    __table_args__ = (Index("ix_check_override_run", "run_id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    kind: str
    check_name: str
    detail: str = Field(sa_column=_text(False))
    reason: str = Field(sa_column=_text(False))
    actor: str
    created_at: float


class ServerMetric(SQLModel, table=True):
    """What an endpoint's own /metrics said at one scrape (synthwatch.workers.server_metrics)."""

    __tablename__ = "server_metric"
    __table_args__ = (Index("ix_server_metric_run", "run_id", "endpoint", "t"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    worker_id: int
    endpoint: str
    t: float
    kind: str | None = None  # vllm | sglang | unknown
    version: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    preemptions_s: float | None = None
    gen_tokens_s: float | None = None
    prompt_tokens_s: float | None = None
    queue_p50_s: float | None = None
    queue_p95_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    error: str | None = Field(default=None, sa_column=_text())
    interval_s: float | None = None  # the time since the previous scrape; None on the first (gauges only)
    preemptions: float | None = None  # preemptions counted in the interval
    queue_mean_s: float | None = None  # from the histogram's _sum/_count over the interval
    ttft_mean_s: float | None = None
    quantiles: str | None = Field(default=None, sa_column=_text())  # JSON: p50/p95 as the buckets resolve them
    aborted: float | None = None  # requests the server aborted / ended in error in the interval
    errored: float | None = None
    prefix_hit_rate: float | None = None  # 0..1
    max_concurrency: float | None = None  # the server's own estimate of requests that fit (vLLM, SGLang)
    waiting_by_reason: str | None = Field(default=None, sa_column=_text())  # JSON: reason -> waiting requests


class Dashboard(SQLModel, table=True):
    """A running dashboard's address (synthwatch.store.dashboards): the CLI's links point at it."""

    __tablename__ = "dashboard"

    id: int | None = Field(default=None, primary_key=True)
    url: str = Field(sa_column=_text(False))
    host: str
    pid: int
    started_at: float


class OpenItem(SQLModel, table=True):
    """What an alarm left behind: records failing its check, until repaired, excluded or accepted (migration 0012)."""

    __tablename__ = "open_item"
    __table_args__ = (Index("ix_open_item_run", "run_id", "state"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    check_name: str
    alarm_id: int | None = None  # the alarm that opened it
    follows: int | None = None  # the closed item on the same check before this one
    since: float | None = None  # counts records finished after this (an item after an acceptance)
    state: str  # open | repaired | excluded | accepted
    opened_at: float
    updated_at: float
    n_records: int  # finished records failing the check now, not flagged bad
    n_excluded: int  # failing records flagged bad
    n_queued: int  # queued for a re-run, their earlier output failing the check (not counted as failing)
    n_peak: int  # the most records it ever counted
    first_t: float | None = None  # first / last finish time of the records it counts
    last_t: float | None = None
    closed_at: float | None = None
    closed_by: str | None = None
    reason: str | None = Field(default=None, sa_column=_text())  # an acceptance's typed reason


VERDICT_STATES = ("pending", "pass", "fail", "error")


class CheckVerdict(SQLModel, table=True):
    """One verdict of an extended check on one record (migration 0014, synthwatch.quality.verdicts).

    Appended, never updated: the latest row per (record_id, check_name) by id is the verdict in force."""

    __tablename__ = "check_verdict"
    __table_args__ = (Index("ix_check_verdict_state", "run_id", "check_name", "state"),
                      Index("ix_check_verdict_record", "record_id", "check_name", "id"))

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id", index=True)
    record_id: int = Field(foreign_key="record.id")
    check_name: str  # catalogue name: verify_math, user:boxed, rule:has_boxed, language, near_duplicate, judge
    state: str  # pending | pass | fail | error
    score: float | None = None
    label: str | None = None
    reason: str | None = Field(default=None, sa_column=_text())  # <= 500 characters, escaped on display
    cost_ms: float | None = None
    created_at: float


class JudgeUsage(SQLModel, table=True):
    """What a run's judge model cost (synthwatch.workers.judge), apart from the run's own requests (migration 0017_judge)."""

    __tablename__ = "judge_usage"
    __table_args__ = (UniqueConstraint("run_id", name="uq_judge_usage_run"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    requests: int = 0  # judge requests sent (every attempt)
    failed_attempts: int = 0
    n_pass: int = 0  # verdicts written, by state
    n_fail: int = 0
    n_error: int = 0
    prompt_tokens: int = Field(default=0, sa_type=TOKENS)
    completion_tokens: int = Field(default=0, sa_type=TOKENS)
    guided: str | None = None  # json_schema | prompt: how the last verdict was asked for
    updated_at: float = 0.0
