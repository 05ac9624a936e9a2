"""One benchmark run end to end: ask the server, plan the trace, replay it, summarize."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tropical.bench.config import BenchConfig
from tropical.bench.plan import PlannedRequest, plan_requests
from tropical.bench.record import Measurement
from tropical.bench.replay import replay
from tropical.bench.server import Endpoint, ServedModel, served_model
from tropical.bench.summary import BenchSummary, summarize_bench
from tropical.core.request import Request
from tropical.workload.catalog import load_slice
from tropical.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class BenchRun:
    """Everything a report of the run needs, request by request and in summary."""

    config: BenchConfig
    model: ServedModel
    rate_rps: float
    planned: list[PlannedRequest]
    measurements: list[Measurement]
    requests: list[Request]
    summary: BenchSummary


def workload(cfg: BenchConfig) -> Trace:
    """The trace slice ``cfg`` selects, arrivals and lengths transformed as its flags say."""
    trace = load_slice(cfg.trace, cfg.limit, cfg.arrivals, cfg.seed, rate=cfg.rate, arrival_cv=cfg.arrival_cv,
                       length_scale=cfg.length_scale, bounds=cfg.bounds)
    if not len(trace):
        raise ValueError(f"trace {cfg.trace!r} has no requests in the selected slice (check --limit)")
    return trace


def run_bench(cfg: BenchConfig) -> BenchRun:
    trace = workload(cfg)
    endpoint = Endpoint(cfg.url, cfg.api_key)
    model = served_model(endpoint, cfg.model)
    planned = plan_requests(trace, cfg.rate_scale, model.max_model_len)
    measured = asyncio.run(replay(planned, endpoint, model.id, cfg.prompt_format, cfg.seed, cfg.timeout))
    requests = [m.to_request(cfg.slo) for m in measured]
    return BenchRun(cfg, model, trace.mean_rate * cfg.rate_scale, planned, measured, requests,
                    summarize_bench(measured, requests))
