"""The simulator's server side as vLLM and SGLang show it: a capacity model, `/metrics` and `/version`.

Capacity model: with ``capacity = K > 0`` at most K requests generate at once; the others wait in a queue
(FIFO), so throughput saturates at K x tokens_per_s and latency grows past the knee by the time spent
queued, as on a real server whose batch is full. ``/metrics`` is written by the official Prometheus
client library, with the names of the server kind it imitates (facts from a vLLM 0.32 CPU build and
SGLang's documentation): ``vllm`` (``vllm:kv_cache_usage_perc``), ``vllm-old`` (``vllm:gpu_cache_usage_perc``,
before the rename), ``sglang`` (``sglang:num_running_reqs`` ...), or ``none`` (no metrics: 404).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SERVER_KINDS = ("vllm", "vllm-old", "sglang", "none")
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class ServerView:
    def __init__(self, kind: str, version: str, capacity: int, model: str, max_model_len: int) -> None:
        if kind not in SERVER_KINDS:
            raise ValueError(f"server_kind must be one of {', '.join(SERVER_KINDS)}")
        self.kind, self.version, self.model, self.max_model_len = kind, version, model, max_model_len
        self.capacity = capacity
        self.running = 0
        self.waiting = 0
        self._sem: asyncio.Semaphore | None = None
        self._sem_k = 0
        self._started = time.time()
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        lv = {"model_name": model, "engine": "0"}
        if kind in ("vllm", "vllm-old"):
            p = "vllm:"
            kv_name = p + ("kv_cache_usage_perc" if kind == "vllm" else "gpu_cache_usage_perc")
            self._running = Gauge(p + "num_requests_running", "Requests in the model's batch", labels,
                                  registry=self.registry).labels(**lv)
            self._waiting = Gauge(p + "num_requests_waiting", "Requests waiting to be scheduled", labels,
                                  registry=self.registry).labels(**lv)
            self._kv = Gauge(kv_name, "KV-cache usage (1 = full)", labels, registry=self.registry).labels(**lv)
            self._gen = Counter(p + "generation_tokens", "Generated tokens", labels, registry=self.registry).labels(**lv)
            self._prompt = Counter(p + "prompt_tokens", "Prefilled prompt tokens", labels,
                                   registry=self.registry).labels(**lv)
            self._preempt = Counter(p + "num_preemptions", "Preempted requests", labels,
                                    registry=self.registry).labels(**lv)
            # vLLM labels finished requests by why they finished (stop, length, abort, error)
            self._success = Counter(p + "request_success", "Finished requests", labels + ["finished_reason"],
                                    registry=self.registry)
            self._prefix_queries = Counter(p + "prefix_cache_queries", "Prefix-cache queries (tokens)", labels,
                                           registry=self.registry).labels(**lv)
            self._prefix_hits = Counter(p + "prefix_cache_hits", "Prefix-cache hits (tokens)", labels,
                                        registry=self.registry).labels(**lv)
            self._cache_info = Gauge(p + "cache_config_info", "Information of the KV cache", [
                "block_size", "num_gpu_blocks", "kv_cache_max_concurrency"], registry=self.registry)
            self._queue = Histogram(p + "request_queue_time_seconds", "Time waiting for the batch", labels,
                                    buckets=_BUCKETS, registry=self.registry).labels(**lv)
            self._ttft = Histogram(p + "time_to_first_token_seconds", "Time to the first token", labels,
                                   buckets=_BUCKETS, registry=self.registry).labels(**lv)
            self._e2e = Histogram(p + "e2e_request_latency_seconds", "Whole request", labels,
                                  buckets=_BUCKETS, registry=self.registry).labels(**lv)
        elif kind == "sglang":
            p = "sglang:"
            self._running = Gauge(p + "num_running_reqs", "Running requests", labels,
                                  registry=self.registry).labels(**lv)
            self._waiting = Gauge(p + "num_queue_reqs", "Queued requests", labels, registry=self.registry).labels(**lv)
            self._kv = Gauge(p + "token_usage", "KV token usage (1 = full)", labels, registry=self.registry).labels(**lv)
            self._throughput = Gauge(p + "gen_throughput", "Generation throughput (tokens/s)", labels,
                                     registry=self.registry).labels(**lv)
            self._preempt = Counter(p + "num_preemptions", "Preempted requests", labels,
                                    registry=self.registry).labels(**lv)
            self._gen = Counter(p + "generation_tokens", "Generated tokens", labels, registry=self.registry).labels(**lv)
            self._prompt = Counter(p + "prompt_tokens", "Prefilled prompt tokens", labels,
                                   registry=self.registry).labels(**lv)
            self._queue = Histogram(p + "queue_time_seconds", "Time in the queue", labels, buckets=_BUCKETS,
                                    registry=self.registry).labels(**lv)
            self._ttft = Histogram(p + "time_to_first_token_seconds", "Time to the first token", labels,
                                   buckets=_BUCKETS, registry=self.registry).labels(**lv)
        self._tokens_window: list[tuple[float, int]] = []
        self._lv = lv
        self.kv_max_concurrency = capacity  # what the server says fits at once (0: it does not say)

    # -- the capacity model ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold one of the K generation slots (wait in the queue for one); yields the time spent queued."""
        t0 = time.monotonic()
        if self.capacity > 0:
            if self._sem is None or self._sem_k != self.capacity:
                self._sem, self._sem_k = asyncio.Semaphore(self.capacity), self.capacity
            sem = self._sem
            self.waiting += 1
            try:
                await sem.acquire()
            finally:
                self.waiting -= 1
        queued = time.monotonic() - t0
        self.running += 1
        try:
            yield queued
        finally:
            self.running -= 1
            if self.capacity > 0 and self._sem is not None:
                self._sem.release()

    def preempted(self) -> None:
        if self.kind != "none":
            self._preempt.inc()

    def observe(self, *, prompt_tokens: int, completion_tokens: int, queued_s: float, ttft_s: float,
                e2e_s: float | None, finish: str = "stop") -> None:
        if self.kind == "none":
            return
        self._prompt.inc(prompt_tokens)
        self._gen.inc(completion_tokens)
        self._queue.observe(queued_s)
        self._ttft.observe(ttft_s)
        if self.kind != "sglang":
            self._success.labels(**self._lv, finished_reason="length" if finish == "length" else
                                 finish if finish in ("abort", "error") else "stop").inc()
            # every prompt is looked up in the prefix cache; the simulator's prompts share their system part,
            # about a quarter of the tokens (a stand-in, so that the hit rate has something to show)
            self._prefix_queries.inc(prompt_tokens)
            self._prefix_hits.inc(prompt_tokens // 4)
            if e2e_s is not None:
                self._e2e.observe(e2e_s)
        now = time.monotonic()
        self._tokens_window.append((now, completion_tokens))
        while self._tokens_window and self._tokens_window[0][0] < now - 10:
            self._tokens_window.pop(0)

    # -- what the server answers -------------------------------------------------------------------

    def metrics(self) -> bytes | None:
        if self.kind == "none":
            return None
        self._running.set(self.running)
        self._waiting.set(self.waiting)
        k = max(self.capacity, 1)
        self._kv.set(min(1.0, self.running / k) if self.capacity else min(1.0, self.running / 256))
        if self.kind == "sglang":
            self._throughput.set(sum(n for _, n in self._tokens_window) / 10.0)
        elif self.kv_max_concurrency and self.kind == "vllm":  # older vLLM had no kv_cache_max_concurrency label
            self._cache_info.labels(block_size="16", num_gpu_blocks=str(self.kv_max_concurrency * 64),
                                    kv_cache_max_concurrency=f"{float(self.kv_max_concurrency):.2f}").set(1)
        return generate_latest(self.registry)

    def version_body(self) -> bytes | None:
        if self.kind in ("vllm", "vllm-old"):
            return orjson.dumps({"version": self.version})
        return None

    def server_info(self) -> bytes | None:
        if self.kind != "sglang":
            return None
        info: dict[str, Any] = {"version": self.version, "model_path": self.model,
                                "context_length": self.max_model_len}
        if self.kv_max_concurrency:
            info["max_running_requests"] = self.kv_max_concurrency
        return orjson.dumps(info)
