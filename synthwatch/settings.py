"""The one typed settings object for process-wide options (env prefix ``SYNTHWATCH_``).

Per-run options live in :mod:`synthwatch.config` (``RunConfig``); these are the knobs of the
process itself: where the database is, where the dashboard listens, how often pages poll.
Every field is documented in docs/settings.md (a test checks it).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYNTHWATCH_", env_ignore_empty=True, extra="ignore")

    db: str = Field("synthwatch.db", description="Database: a SQLite file path or any SQLAlchemy URL.")
    host: str = Field("127.0.0.1", description="Address the dashboard binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the dashboard listens on.")
    dashboard_url: str | None = Field(
        None, description="Where the dashboard is, e.g. http://127.0.0.1:8080 (behind a proxy: its public address): "
        "the base of every link the CLI prints and of alarms' links. Unset: the dashboard running on the same "
        "database (`synthwatch serve` records its address there); none running: the CLI says how to start one.")
    auth_token: str | None = Field(
        None, description="Token required by every page and API call (required off loopback)."
    )
    poll_interval_ms: int = Field(2000, ge=100, description="How often live fragments refresh.")
    busy_timeout_ms: int = Field(10000, ge=0, description="SQLite busy timeout for every connection.")
    stats_time_limit_ms: int = Field(500, ge=10, description="Longest a dashboard stats query may run.")
    search_index_interval_ms: int = Field(
        1000, ge=50, description="How often the dashboard looks for finished records to add to the search index."
    )
    search_index_lock_ms: int = Field(
        100, ge=5, le=5000, description="Longest write transaction of the search indexer (workers wait this long at most)."
    )
    search_catch_up_ms: int = Field(
        300, ge=0, description="How long a search first spends indexing records not yet searchable."
    )
    rate_window_s: int = Field(
        60, ge=5, le=3600, description="Window of the run page's current rates, in seconds: the tiles, the per-endpoint "
        "rows, the workers table and the Server card's client tok/s (each divided by the part of it the run covers).")
    worker_heartbeat_s: float = Field(1.0, gt=0, description="How often a worker writes its heartbeat.")
    dead_worker_after_s: float = Field(15.0, gt=0, description="A worker silent this long is shown dead.")
    live_streams_refresh_ms: int = Field(
        1000, ge=0, le=60_000, description="How often a worker publishes the snapshot of its streams in flight (the "
        "run page's Streams panel, GET /api/runs/{id}/streams, watch-streams); 0 publishes none.")
    inflight_checks: bool = Field(
        True, description="Judge streams while they are written (the checks on streams in flight, #36): a worker "
        "started with false judges only finished records (the A/B of their cost in python -m bench scale).")
    stream_read_batch_ms: int = Field(
        500, ge=0, le=2000, description="Read pacing of streams that trickle: after a small read (under 4 KiB) of a "
        "stream past its first second, the worker stops reading that connection until its next tick, this often, so "
        "that one network read brings several tokens (#39: the per-read cost was half the worker's CPU at 2,048 "
        "streams). Tokens reach the capture, the live view and the in-flight checks up to this late; the first "
        "token never waits; 0 reads every segment as it comes.")
    long_text_spool_chars: int = Field(
        4 * 2**20, ge=0, description="A reasoning or content longer than this (characters) is written to the store "
        "in pieces, from a temporary file (beside a SQLite database), once the checks have read it: the worker then "
        "holds a long text about twice while storing it instead of three times (#39); the tokenizer checks take no "
        "text this long. 0 writes every text whole.")
    live_stream_tail_chars: int = Field(
        300, ge=0, le=4000, description="Characters of reasoning and of content per stream in that snapshot (the last "
        "ones; never the whole text).")
    live_streams_max: int = Field(
        64, ge=0, le=4096, description="Streams per worker in that snapshot (its oldest); the count of all of them is "
        "published too.")
    max_request_body_bytes: int = Field(
        4 * 2**20, ge=1024, description="Largest request body the dashboard accepts (JSON API, forms); a larger one is "
        "refused with 413 before it is read.")
    launch_key_envs: str = Field(
        "", description="Comma-separated environment variables the start-a-run form may name as api_key_env, "
        "besides those starting with SYNTHWATCH_KEY_.")
    launch_dataset_dirs: str = Field(
        "data", description="Folders the start-a-run form may read datasets from, separated by ':'; relative "
        "folders are resolved against the dashboard's working directory.")
    launch_tokenizer_dirs: str = Field(
        "tokenizers", description="Folders the start-a-run form and a run's settings may load tokenizers (and chat "
        "templates) from, besides the packaged 'deepseek-v4', separated by ':'; relative folders are resolved "
        "against the dashboard's working directory.")
    launch_tls_dirs: str = Field(
        "tls", description="Folders a run's endpoints may name TLS files from (tls.ca_bundle, tls.client_cert, "
        "tls.client_key) when set from the dashboard or its API, separated by ':'; relative folders are resolved "
        "against the dashboard's working directory.")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
