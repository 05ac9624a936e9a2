"""The work bound: the request rate at which a cluster would be busy all the time.

Each request costs its prefill alone on an idle worker plus its share of decode iterations at
the largest batch KV allows (the iteration's fixed cost split over the batch, its own context's
cost in full), with no interference and no migration: the same latency model the simulator
prices iterations with. Given the requests' SLOs, a request's batch is also no larger than one
whose decode iteration, at the trace's mean context, keeps its TPOT SLO: a tight TPOT SLO makes
decodes costlier per token, so the bound falls with it. No policy can serve a trace faster in
steady state; on a finite trace a policy can pass it only by leaving work queued when the last
request arrives, which ``queued_work`` measures from the requests' recorded times. Some of that
work is only in flight, not deferred: ``unwaited_work`` prices the same moment had every request
started at its arrival (prefill alone, decode at the bound's batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class Work:
    """Seconds of one worker's time a request needs, by phase."""

    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.prefill + self.decode


@dataclass(frozen=True, slots=True)
class WorkBound:
    """The bound and what it is made of (means per request, on the reference worker; ``batch``
    is the median request's decode batch there)."""

    rate_rps: float
    prefill_s: float
    decode_s: float
    batch: int
    workers: int

    def share(self, rate_rps: float) -> float:
        """A rate as a fraction of the bound."""
        return rate_rps / self.rate_rps if self.rate_rps > 0 else float("nan")


def request_work(latency: LatencyModel, prompt: int, output: int, batch: int, cached: int = 0) -> Work:
    """One request's work on a worker decoding ``batch`` requests at a time, ``cached`` of its
    prompt tokens found in a prefix cache (computed before; attended, not recomputed)."""
    intercept, slope = latency.decode_line(batch)
    tokens = output - 1
    decode = tokens * (intercept / batch + slope * (prompt + output / 2)) if tokens > 0 else 0.0
    return Work(prefill_time(latency, prompt - cached, cached), decode)


def full_batch(trace: Trace, kv_tokens: int, max_seqs: int) -> int:
    """The largest decode batch a worker's KV holds for this trace's mean request."""
    mean_kv = sum(e.input_len + e.output_len - 1 for e in trace.entries) / len(trace)
    return max(1, min(max_seqs, int(kv_tokens // mean_kv)))


def tpot_batch(latency: LatencyModel, tpot: float, context: float, most: int) -> int:
    """The largest decode batch up to ``most`` whose iteration, every request at ``context``
    tokens, takes at most ``tpot`` (1 when even a lone decode takes longer)."""
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if decode_time(latency, mid, int(mid * context)) <= tpot else (lo, mid - 1)
    return lo


def work_bound(trace: Trace, cluster: ClusterSpec, max_seqs: int,
               slos: Sequence[SLO] | None = None, hits: Sequence[int] | None = None) -> WorkBound:
    """Requests per second the cluster would serve if every worker were always busy; with
    ``slos`` (one per trace entry), decode batches keep each request's TPOT SLO too; with
    ``hits`` (one per entry, see ``ideal_cache``), that many prompt tokens are cached."""
    return bound_from(cluster_works(trace, cluster, max_seqs, slos, hits))


def cluster_works(trace: Trace, cluster: ClusterSpec, max_seqs: int,
                  slos: Sequence[SLO] | None = None,
                  hits: Sequence[int] | None = None) -> list[tuple[list[Work], list[int]]]:
    """``worker_works`` of every worker of the cluster, the first being the reference."""
    if not len(trace):
        raise ValueError("the work bound needs a trace with requests")
    if slos is not None and len(slos) != len(trace):
        raise ValueError(f"the work bound needs one SLO per request: {len(slos)} for {len(trace)}")
    cached = [0] * len(trace) if hits is None else hits
    return [worker_works(trace, spec, max_seqs, slos, cached) for spec in cluster.workers]


def bound_from(parts: Sequence[tuple[list[Work], list[int]]]) -> WorkBound:
    """The bound of workers whose requests' works (and decode batches) ``worker_works`` priced,
    the first worker's being the reference."""
    rate = sum(len(works) / sum(w.total for w in works) for works, _ in parts)
    works, batches = parts[0]
    return WorkBound(rate, sum(w.prefill for w in works) / len(works),
                     sum(w.decode for w in works) / len(works), sorted(batches)[len(batches) // 2],
                     len(parts))


def worker_works(trace: Trace, spec: WorkerSpec, max_seqs: int, slos: Sequence[SLO] | None,
                 hits: Sequence[int]) -> tuple[list[Work], list[int]]:
    """Each request's work on one worker (``hits`` of its prompt tokens cached), and the decode
    batch it was priced at (the largest the KV holds, and with ``slos`` also one that keeps the
    request's TPOT SLO)."""
    context = sum(e.input_len + e.output_len / 2 for e in trace.entries) / len(trace)
    most = full_batch(trace, spec.kv_capacity_tokens, max_seqs)
    batches = ([most] * len(trace) if slos is None else
               [tpot_batch(spec.latency, slo.tpot, context, most) for slo in slos])
    return ([request_work(spec.latency, e.input_len, e.output_len, b, hit)
             for e, b, hit in zip(trace.entries, batches, hits, strict=True)], batches)


def queued_work(requests: Sequence[Request], latency: LatencyModel, batch: int,
                at: float) -> tuple[float, float]:
    """Work still to do at time ``at`` and all the work, in seconds of one worker.

    A phase under way counts the part of it not yet elapsed (linear in time); a failed request
    counts whole, as it was never served. A prompt is priced without the tokens its worker
    found in its prefix cache.
    """
    left = total = 0.0
    for req in requests:
        work = request_work(latency, req.prompt_len, req.output_len, batch, req.cached)
        total += work.total
        if req.error is not None:
            left += work.total
            continue
        left += work.prefill * _undone(req.prefill_start, req.first_token, at)
        left += work.decode * _undone(req.first_token, req.finish, at)
    return left, total


def unwaited_work(requests: Sequence[Request], latency: LatencyModel, batch: int,
                  at: float) -> float:
    """Work still to do at ``at`` had every request been served from its arrival without
    waiting: its prefill alone, then one token per decode iteration at ``batch`` (priced like
    ``queued_work``, so the two compare)."""
    left = 0.0
    for req in requests:
        work = request_work(latency, req.prompt_len, req.output_len, batch, req.cached)
        first = req.arrival + work.prefill
        iteration = decode_time(latency, batch, int(batch * (req.prompt_len + req.output_len / 2)))
        left += work.prefill * _undone(req.arrival, first, at)
        left += work.decode * _undone(first, first + (req.output_len - 1) * iteration, at)
    return left


def _undone(start: float | None, end: float | None, at: float) -> float:
    """Fraction of the phase from ``start`` to ``end`` still ahead at ``at``."""
    if end is None or start is None or at <= start:
        return 1.0
    if at >= end or end <= start:
        return 0.0
    return (end - at) / (end - start)
