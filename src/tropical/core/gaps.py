"""Inter-token gaps of many requests, kept as a fixed log-bucket histogram.

A simulated cluster books millions of gaps, mostly as closed-form runs of decode iterations
whose durations grow linearly, so gaps are counted into buckets (20 per decade, ±6% at the
bucket's geometric middle) rather than stored: a run of any length costs one step per bucket
it spans. The mean is kept exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

LOW: Final = 1e-5
PER_DECADE: Final = 20
BUCKETS: Final = 8 * PER_DECADE
_RATIO: Final = 10 ** (1 / PER_DECADE)
_LOG_RATIO: Final = math.log(_RATIO)


def bucket_of(gap: float) -> int:
    """The bucket holding ``gap`` (gaps under ``LOW`` go to the first, huge ones to the last)."""
    if gap <= LOW:
        return 0
    return min(BUCKETS - 1, int(math.log(gap / LOW) / _LOG_RATIO))


def upper_edge(bucket: int) -> float:
    return LOW * _RATIO ** (bucket + 1)


def middle(bucket: int) -> float:
    """The geometric middle of a bucket: what a percentile falling in it reports."""
    return LOW * _RATIO ** (bucket + 0.5)


@dataclass(slots=True)
class GapHistogram:
    """Counts of gaps per log bucket, with their exact total for the mean."""

    counts: list[float] = field(default_factory=lambda: [0.0] * BUCKETS)
    total: float = 0.0
    count: float = 0.0

    def add(self, gap: float, weight: float = 1.0) -> None:
        """``weight`` gaps of ``gap`` seconds each."""
        self.counts[bucket_of(gap)] += weight
        self.total += gap * weight
        self.count += weight

    def add_series(self, first: float, growth: float, steps: int, weight: float) -> None:
        """``weight`` gaps for each of ``first + growth·j``, j = 0 … steps−1 (a decode run)."""
        if steps <= 0:
            return
        last = first + growth * (steps - 1)
        self.total += weight * steps * (first + last) / 2
        self.count += weight * steps
        lo, hi = bucket_of(first), bucket_of(last)
        if lo == hi or growth <= 0:
            self.counts[lo] += weight * steps
            return
        done = 0
        for bucket in range(lo, hi):
            below = min(steps, max(done, math.ceil((upper_edge(bucket) - first) / growth)))
            self.counts[bucket] += weight * (below - done)
            done = below
        self.counts[hi] += weight * (steps - done)

    def merge(self, other: GapHistogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total
        self.count += other.count

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0–100), at its bucket's middle; NaN when empty."""
        if self.count <= 0:
            return float("nan")
        rank = q / 100 * self.count
        seen = 0.0
        for bucket, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c > 0:
                return middle(bucket)
        return middle(BUCKETS - 1)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else float("nan")

    @classmethod
    def merged(cls, parts: Iterable[GapHistogram]) -> GapHistogram:
        out = cls()
        for part in parts:
            out.merge(part)
        return out
