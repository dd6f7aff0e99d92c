"""A worker's own Prometheus metrics (`synthwatch run --metrics-port N`): what this process does right now.

The dashboard's `/metrics` shows every run from the database; this one is for scraping each worker process
directly (its requests in flight, its finished records, failed attempts by kind, tokens, per endpoint state),
served by the official client library's HTTP server on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

WORKER_FAMILIES = {
    "synthwatch_worker_in_flight": "Requests this worker has running",
    "synthwatch_worker_concurrency": "The concurrency this worker runs at",
    "synthwatch_worker_records_total": "Records this worker finished, by outcome",
    "synthwatch_worker_attempt_failures_total": "Failed attempts of this worker, by kind",
    "synthwatch_worker_completion_tokens_total": "Completion tokens of this worker's ok records",
    "synthwatch_worker_endpoint_outstanding": "Requests outstanding per endpoint",
    "synthwatch_worker_endpoint_rate_limited_total": "429 / 503 answers per endpoint",
}


class WorkerCollector(Collector):
    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        s = w.stats
        run = [str(w.config.name or w.run_id)]
        g = GaugeMetricFamily("synthwatch_worker_in_flight", WORKER_FAMILIES["synthwatch_worker_in_flight"],
                              labels=["run"])
        g.add_metric(run, len(w.tasks))
        yield g
        conc = int(w.writer.control.get("concurrency") or w.config.concurrency) if w.writer else w.config.concurrency
        g = GaugeMetricFamily("synthwatch_worker_concurrency", WORKER_FAMILIES["synthwatch_worker_concurrency"],
                              labels=["run"])
        g.add_metric(run, conc)
        yield g
        c = CounterMetricFamily("synthwatch_worker_records", WORKER_FAMILIES["synthwatch_worker_records_total"],
                                labels=["run", "outcome"])
        for outcome, n in (("ok", s.ok), ("error", s.errors), ("timeout", s.timeouts)):
            c.add_metric([*run, outcome], n)
        yield c
        c = CounterMetricFamily("synthwatch_worker_attempt_failures",
                                WORKER_FAMILIES["synthwatch_worker_attempt_failures_total"], labels=["run", "kind"])
        for kind, n in (("timeout", s.attempt_timeouts), ("rate_limited", s.rate_limited),
                        ("server_error", s.server_errors)):
            c.add_metric([*run, kind], n)
        yield c
        c = CounterMetricFamily("synthwatch_worker_completion_tokens",
                                WORKER_FAMILIES["synthwatch_worker_completion_tokens_total"], labels=["run"])
        c.add_metric(run, s.completion_tokens)
        yield c
        g = GaugeMetricFamily("synthwatch_worker_endpoint_outstanding",
                              WORKER_FAMILIES["synthwatch_worker_endpoint_outstanding"], labels=["run", "endpoint", "state"])
        c = CounterMetricFamily("synthwatch_worker_endpoint_rate_limited",
                                WORKER_FAMILIES["synthwatch_worker_endpoint_rate_limited_total"], labels=["run", "endpoint"])
        for ep in w.pool.public():
            state = str(ep.get("state", "normal")).split(" until ")[0]
            g.add_metric([*run, ep["label"], state], ep["outstanding"])
            c.add_metric([*run, ep["label"]], ep.get("rate_limited", 0))
        yield g
        yield c


def serve(worker: Any, port: int, host: str = "127.0.0.1") -> int:
    """Start the metrics server in a daemon thread; returns the port it listens on."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    server, thread = start_http_server(port, addr=host, registry=registry)
    supervisor = getattr(worker, "supervisor", None)
    if supervisor is not None:  # it serves until the process ends: its thread ending early is a failure
        supervisor.watch_thread(thread, "the metrics server thread")
    return int(server.server_port)
