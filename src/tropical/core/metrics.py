"""Latency metrics exactly as DESIGN.md defines them (vLLM's benchmark conventions).

TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1), 0 for a single
output token; queueing = prefill start − arrival; E2E = finish − arrival. A request attains its
SLO only when TTFT and TPOT both meet their targets; failed requests never attain. It *stream*
attains when it also never waited longer than its TBT SLO between two tokens: mean TPOT hides
stalls, this does not. A stall is a gap over one second; ITL is the gap between two tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from tropical.core.gaps import GapHistogram
from tropical.core.request import Request

PERCENTILES = (50, 90, 99)
STALL_S: Final = 1.0


def ttft(req: Request) -> float:
    assert req.first_token is not None, f"request {req.id} has no first token"
    return req.first_token - req.arrival


def tpot(req: Request) -> float:
    assert req.finish is not None and req.first_token is not None
    if req.output_len <= 1:
        return 0.0
    return (req.finish - req.first_token) / (req.output_len - 1)


def queueing(req: Request) -> float:
    assert req.prefill_start is not None, f"request {req.id} never started its prefill"
    return req.prefill_start - req.arrival


def e2e(req: Request) -> float:
    assert req.finish is not None
    return req.finish - req.arrival


def attains(req: Request) -> bool:
    """Joint attainment: TTFT and TPOT within this request's own SLO."""
    if req.error is not None or req.finish is None:
        return False
    return ttft(req) <= req.slo.ttft and tpot(req) <= req.slo.tpot


def stream_attains(req: Request) -> bool:
    """Joint attainment, and no gap between two tokens longer than the TBT SLO."""
    return attains(req) and req.max_gap <= req.slo.tbt


def miss_cause(req: Request) -> str | None:
    """Why ``req`` misses stream attainment (None if it does not): ``failed``; ``TTFT queueing``
    when it waited longer for its prefill to start than the prefill took (migration aside),
    else ``TTFT execution``; ``TPOT`` (mean); ``stall`` (a gap over the TBT SLO, mean TPOT met)."""
    if req.error is not None or req.finish is None:
        return "failed"
    if ttft(req) > req.slo.ttft:
        waited = queueing(req)
        return "TTFT queueing" if waited > ttft(req) - waited else "TTFT execution"
    if tpot(req) > req.slo.tpot:
        return "TPOT"
    return "stall" if req.max_gap > req.slo.tbt else None


def stalled(req: Request) -> bool:
    """Did the stream pause for more than ``STALL_S`` between two tokens?"""
    return req.max_gap > STALL_S


@dataclass(frozen=True, slots=True)
class Distribution:
    """Percentiles of one metric over completed requests (NaN when there are none)."""

    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of_histogram(cls, gaps: GapHistogram | None) -> Distribution:
        """Percentiles read off a gap histogram (NaN without one)."""
        if gaps is None:
            return cls.of([])
        p50, p90, p99 = (gaps.percentile(q) for q in PERCENTILES)
        return cls(p50, p90, p99, gaps.mean)

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if len(values) == 0:
            return cls(float("nan"), float("nan"), float("nan"), float("nan"))
        p50, p90, p99 = np.percentile(np.asarray(values, dtype=float), PERCENTILES)
        return cls(float(p50), float(p90), float(p99), float(np.mean(values)))


@dataclass(frozen=True, slots=True)
class Summary:
    """What one run of a workload achieved."""

    requests: int
    completed: int
    failed: int
    attainment: float
    ttft: Distribution
    tpot: Distribution
    queueing: Distribution
    e2e: Distribution
    throughput_rps: float
    output_tokens_per_s: float
    paths: dict[str, int] = field(default_factory=dict)
    stream_attainment: float = 0.0
    stall_share: float = 0.0
    itl: Distribution = field(default_factory=lambda: Distribution.of([]))
    max_gap: Distribution = field(default_factory=lambda: Distribution.of([]))
    ttft_max: float = float("nan")
    prefix_hit_rate: float = 0.0
    migrated_tokens: float = 0.0
    rejected: dict[str, int] = field(default_factory=dict)

    @property
    def rejection_rate(self) -> float:
        """Requests the admission stage refused, over all requests (each is also a miss)."""
        return sum(self.rejected.values()) / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float | int | dict[str, int]]:
        """Flat keys (``ttft_p90_s``...) for JSON output and reports."""
        flat: dict[str, float | int | dict[str, int]] = {
            "requests": self.requests, "completed": self.completed, "failed": self.failed,
            "attainment": self.attainment, "throughput_rps": self.throughput_rps,
            "output_tokens_per_s": self.output_tokens_per_s, "paths": dict(self.paths),
            "stream_attainment": self.stream_attainment, "stall_share": self.stall_share,
            "ttft_max_s": self.ttft_max, "prefix_hit_rate": self.prefix_hit_rate,
            "migrated_tokens_mean": self.migrated_tokens,
            "rejected": dict(self.rejected), "rejection_rate": self.rejection_rate,
        }
        for metric in ("ttft", "tpot", "queueing", "e2e", "itl", "max_gap"):
            dist: Distribution = getattr(self, metric)
            key = "queue" if metric == "queueing" else metric
            for stat in ("p50", "p90", "p99", "mean"):
                flat[f"{key}_{stat}_s"] = getattr(dist, stat)
        return flat


def summarize(requests: Sequence[Request], gaps: GapHistogram | None = None) -> Summary:
    """Aggregate finished requests; unfinished, failed or refused ones count against attainment
    (its denominator is every arrival); refusals are also counted by reason.

    ``gaps``: every gap between two tokens, for the ITL percentiles (NaN without it).
    """
    done = [r for r in requests if r.error is None and r.finish is not None]
    run = span(requests)
    ttfts = [ttft(r) for r in done]
    return Summary(
        requests=len(requests),
        completed=len(done),
        failed=sum(r.error is not None for r in requests),
        attainment=sum(map(attains, done)) / len(requests) if requests else 0.0,
        ttft=Distribution.of(ttfts),
        tpot=Distribution.of([tpot(r) for r in done]),
        queueing=Distribution.of([queueing(r) for r in done if r.prefill_start is not None]),
        e2e=Distribution.of([e2e(r) for r in done]),
        throughput_rps=len(done) / run if run > 0 else 0.0,
        output_tokens_per_s=sum(r.output_len for r in done) / run if run > 0 else 0.0,
        paths=dict(Counter(r.path.value for r in requests)),
        stream_attainment=sum(map(stream_attains, done)) / len(requests) if requests else 0.0,
        stall_share=sum(map(stalled, done)) / len(done) if done else 0.0,
        itl=Distribution.of_histogram(gaps),
        max_gap=Distribution.of([r.max_gap for r in done]),
        ttft_max=max(ttfts, default=float("nan")),
        prefix_hit_rate=prefix_hit_rate(requests),
        migrated_tokens=sum(r.migrated_tokens for r in requests) / len(requests) if requests else 0.0,
        rejected=dict(Counter(r.rejected for r in requests if r.rejected is not None)),
    )


def prefix_hit_rate(requests: Sequence[Request]) -> float:
    """Prompt tokens found in a prefix cache over all prompt tokens, of the requests prefilled."""
    prefilled = [r for r in requests if r.first_token is not None]
    prompt = sum(r.prompt_len for r in prefilled)
    return sum(r.reused for r in prefilled) / prompt if prompt else 0.0


def span(requests: Sequence[Request]) -> float:
    """Seconds from the first arrival to the last finish (0 when nothing finished)."""
    finishes = [r.finish for r in requests if r.finish is not None]
    if not finishes:
        return 0.0
    return max(finishes) - min(r.arrival for r in requests)


def goodput(requests: Sequence[Request], attained: Callable[[Request], bool] = attains) -> float:
    """Requests attaining their SLO (by ``attained``: ``stream_attains`` for stream goodput) per
    second of ``span`` (0 when nothing finished)."""
    duration = span(requests)
    return sum(map(attained, requests)) / duration if duration > 0 else 0.0
