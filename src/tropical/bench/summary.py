"""A bench run's numbers: the simulator's summary of the same requests, plus what only a stream
shows (per-token ITL, inter-chunk gaps, stalls), goodput, failures, the paths the server took and
the share of prompt tokens its prefix cache held."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.bench.record import Measurement
from tropical.core.metrics import Distribution, Summary, goodput, span, summarize
from tropical.core.request import Request


@dataclass(frozen=True, slots=True)
class BenchSummary:
    """``core`` as ``tropical sim`` reports it; the rest over completed requests, except failures.

    ``itl`` is per token, ``chunk_gap`` per pair of consecutive token-carrying chunks (see
    ``bench.record``); ``stall_share`` is the share of completed requests with a gap above 1 s;
    ``token_counts_estimated`` counts requests whose per-chunk token counts the server did not state.
    ``prefix_hit_rate`` is the server's ``cached_tokens`` summed over the completed requests that
    report it, over their prompt tokens (NaN when none does), as vLLM's prefix-cache hit rate.
    """

    core: Summary
    itl: Distribution
    chunk_gap: Distribution
    chunk_gap_max_s: float
    stall_share: float
    token_counts_estimated: int
    goodput_rps: float
    duration_s: float
    failures: dict[str, int]
    paths: dict[str, int]
    prefix_hit_rate: float = math.nan
    cached_tokens: int = 0

    def as_dict(self) -> dict[str, object]:
        """Flat JSON-ready keys; queueing is left out (a client cannot see it)."""
        flat = {k: v for k, v in self.core.as_dict().items() if k != "paths" and not k.startswith("queue")}
        for prefix, dist in (("itl", self.itl), ("chunk_gap", self.chunk_gap)):
            flat.update({f"{prefix}_{stat}_s": getattr(dist, stat) for stat in ("p50", "p90", "p99", "mean")})
        flat.update(chunk_gap_max_s=self.chunk_gap_max_s, stall_share=self.stall_share,
                    token_counts_estimated=self.token_counts_estimated, goodput_rps=self.goodput_rps,
                    duration_s=self.duration_s, failures=self.failures, paths=self.paths,
                    prefix_hit_rate=self.prefix_hit_rate, cached_tokens=self.cached_tokens)
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in flat.items()}


def summarize_bench(measurements: Sequence[Measurement], requests: Sequence[Request]) -> BenchSummary:
    """Goodput is requests attaining both SLOs per second from the first send to the last answer."""
    duration = span(requests)
    done = [m for m in measurements if m.error is None]
    gaps = [g for m in done for g in m.chunk_gaps()]
    reported = [m for m in done if m.cached_tokens is not None]
    return BenchSummary(
        core=summarize(requests),
        itl=Distribution.of([v for m in done for v in m.itls()]),
        chunk_gap=Distribution.of(gaps),
        chunk_gap_max_s=max(gaps, default=math.nan),
        stall_share=sum(m.stalled() for m in done) / len(done) if done else math.nan,
        token_counts_estimated=sum(not m.counted for m in done),
        goodput_rps=goodput(requests),
        duration_s=duration,
        failures=dict(Counter(m.error for m in measurements if m.error is not None)),
        paths=dict(Counter(m.path for m in measurements if m.path is not None)),
        prefix_hit_rate=hit_rate(reported),
        cached_tokens=sum(m.cached_tokens or 0 for m in reported),
    )


def hit_rate(reported: Sequence[Measurement]) -> float:
    """Cached prompt tokens over prompt tokens (the server's count where it gave one)."""
    prompt = sum(m.usage_prompt_tokens if m.usage_prompt_tokens is not None else m.prompt_len
                 for m in reported)
    return sum(m.cached_tokens or 0 for m in reported) / prompt if prompt else math.nan
