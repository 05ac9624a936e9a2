"""Prometheus metrics for `tropical serve`, on a private registry so tests and servers never share state.

Latencies are computed by `tropical.core.metrics`, the same definitions the simulator reports, so a live
histogram and a simulated percentile measure the same thing.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from tropical.core.metrics import e2e, queueing, tpot, ttft
from tropical.core.request import Request

# Seconds, from a millisecond decode step to a multi-minute queue under overload.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
WORKER_LABELS = ("worker", "role", "node")


class ServerMetrics:
    """Every metric the server exports; one instance per router process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = self._histogram("tropical_ttft_seconds", "Time to first token")
        self.tpot = self._histogram("tropical_tpot_seconds", "Time per output token after the first")
        self.queueing = self._histogram("tropical_queueing_seconds", "Arrival to prefill start")
        self.e2e = self._histogram("tropical_e2e_seconds", "Arrival to last token")
        self.migration_seconds = self._histogram("tropical_migration_seconds", "KV migration time")
        self.migrations = self._counter("tropical_migrations_total", "KV migrations between workers")
        self.migrated_tokens = self._counter("tropical_migrated_tokens_total", "Tokens of KV migrated")
        self.paths = self._counter("tropical_path_decisions_total", "Where prefills ran", "path")
        self.rejected = self._counter("tropical_rejected_total", "Requests refused before running", "reason")
        self.requests = self._counter("tropical_requests_total", "Requests by how they ended", "outcome")
        self.revivals = self._counter("tropical_worker_revivals_total",
                                      "Dead workers back in service after a restart", "worker")
        self.running = self._worker_gauge("tropical_worker_running", "Requests running on a worker")
        self.waiting = self._worker_gauge("tropical_worker_waiting", "Requests waiting on a worker")
        self.kv_usage = self._worker_gauge("tropical_worker_kv_usage", "Fraction of KV blocks in use")
        self.up = self._worker_gauge("tropical_worker_up", "1 while the worker process is alive")
        self.iterations = self._counter("tropical_iterations_total", "Iterations run", "worker")
        self.prefix_queries = self._counter("tropical_prefix_cache_queries",
                                            "Prompt tokens looked up in a worker's prefix cache (vLLM's "
                                            "prefix_cache_queries)", "worker")
        self.prefix_hits = self._counter("tropical_prefix_cache_hits",
                                         "Prompt tokens found in a worker's prefix cache and not computed "
                                         "(vLLM's prefix_cache_hits)", "worker")
        self.prefill_chunks = self._counter("tropical_prefill_chunks_total",
                                            "Prompt spans that stopped short of their prompt's end")
        self.iteration_seconds = {
            kind: self._counter(f"tropical_iteration_{kind}_seconds_total", doc, "worker")
            for kind, doc in (("wall", "Iteration time as the router sees it (plan, round trip, booking)"),
                              ("compute", "Iteration time inside the worker (forward and sampling)"),
                              ("predicted", "Iteration time the latency profile predicted"))}
        self.worker_labels: dict[int, tuple[str, str, str]] = {}

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(name, doc, buckets=LATENCY_BUCKETS, registry=self.registry)

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _worker_gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, WORKER_LABELS, registry=self.registry)

    def observe_finished(self, req: Request) -> None:
        """Latencies of a request that ended normally, with `output_len` the tokens it actually generated.

        Failed requests have no meaningful latency (count them with `record_request`); TPOT is only
        defined past the first token, so one-token requests add no TPOT sample.
        """
        if req.error is not None or req.finish is None:
            return
        if req.prefill_start is not None:
            self.queueing.observe(queueing(req))
        if req.first_token is not None:
            self.ttft.observe(ttft(req))
            if req.output_len > 1:
                self.tpot.observe(tpot(req))
        self.e2e.observe(e2e(req))

    def record_path(self, path: str) -> None:
        self.paths.labels(path).inc()

    def record_iteration(self, worker_id: int, wall: float, compute: float, predicted: float) -> None:
        """One iteration's times: their gaps are the serving overhead and the profile's error."""
        worker = str(worker_id)
        self.iterations.labels(worker).inc()
        for kind, seconds in (("wall", wall), ("compute", compute), ("predicted", predicted)):
            self.iteration_seconds[kind].labels(worker).inc(seconds)

    def record_prefix_cache(self, worker_id: int, queries: int, hits: int) -> None:
        """Prompts that started on a worker: their tokens, and those its cache held."""
        self.prefix_queries.labels(str(worker_id)).inc(queries)
        self.prefix_hits.labels(str(worker_id)).inc(hits)

    def record_prefill_chunks(self, count: int) -> None:
        self.prefill_chunks.inc(count)

    def record_migration(self, seconds: float, tokens: int) -> None:
        self.migrations.inc()
        self.migrated_tokens.inc(tokens)
        self.migration_seconds.observe(seconds)

    def record_rejection(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def record_request(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def record_revival(self, worker_id: int) -> None:
        self.revivals.labels(str(worker_id)).inc()

    def set_worker(
        self, worker_id: int, role: str, running: int, waiting: int, kv_used_fraction: float, alive: bool,
        node: str = "local",
    ) -> None:
        """A worker's current load; a worker whose role changed drops its series under the old role."""
        labels = (str(worker_id), role, node)
        old = self.worker_labels.get(worker_id)
        if old is not None and old != labels:
            for gauge in self._worker_gauges():
                gauge.remove(*old)
        self.worker_labels[worker_id] = labels
        for gauge, value in zip(self._worker_gauges(), (running, waiting, kv_used_fraction, float(alive)),
                                strict=True):
            gauge.labels(*labels).set(value)

    def _worker_gauges(self) -> tuple[Gauge, Gauge, Gauge, Gauge]:
        return self.running, self.waiting, self.kv_usage, self.up

    def render(self) -> tuple[bytes, str]:
        """The /metrics body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
