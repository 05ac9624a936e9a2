"""Inter-token gaps of one worker's decoding requests, booked where their tokens are booked.

A decode step gives every request in the batch one token. A request that decoded in the
previous step waited since that step ended (prefill-only iterations in between included); one
that joined since (after its prefill here, or when its migrated KV landed) waited since its
first token (migration and the wait for a seat included). Within a closed-form run the later
gaps are the run's iteration times, which grow, so the run's longest is its last.

Each request's longest gap comes from a monotone stack of (step, gap) whose gaps fall as steps
rise: the first entry at or after a step holds the longest gap from that step on. So booking a
run is O(1) amortized and a finishing request asks once, O(log n).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Final

from tropical.core.gaps import GapHistogram
from tropical.core.request import Request

_PRUNE_AT: Final = 256


@dataclass(slots=True)
class TokenGaps:
    """Gap history of one worker: the histogram of every gap, and each request's longest."""

    histogram: GapHistogram = field(default_factory=GapHistogram)
    last_step_end: float = 0.0
    fresh: list[Request] = field(default_factory=list)
    _steps: list[int] = field(default_factory=list)
    _peaks: list[float] = field(default_factory=list)

    def joined(self, req: Request, steps: int) -> None:
        """``req`` decodes here from step ``steps + 1``; its gaps from the step after come from
        the shared history."""
        req.gap_step = steps + 2
        self.fresh.append(req)

    def booked(self, start_step: int, n: int, batch: int, now: float, first: float,
               growth: float) -> None:
        """Steps ``start_step+1 … start_step+n`` of ``batch`` requests, the last ending at
        ``now``; the j-th of them (from 0) lasted ``first + growth·j`` (read only when n > 1)."""
        first_end = now - (n - 1) * first - growth * n * (n - 1) / 2 if n > 1 else now
        for req in self.fresh:
            gap = first_end - req.first_token_at
            self.histogram.add(gap)
            req.max_gap = max(req.max_gap, gap)
        continuing = batch - len(self.fresh)
        self.fresh.clear()
        if continuing > 0:
            gap = first_end - self.last_step_end
            self.histogram.add(gap, continuing)
            self._push(start_step + 1, gap)
        if n > 1:
            self.histogram.add_series(first + growth, growth, n - 1, batch)
            self._push(start_step + n, first + growth * (n - 1))
        self.last_step_end = now

    def finished(self, req: Request) -> None:
        """Fold the shared history since ``req`` joined into its longest gap."""
        i = bisect_left(self._steps, req.gap_step)
        if i < len(self._peaks):
            req.max_gap = max(req.max_gap, self._peaks[i])

    def left(self, req: Request) -> None:
        """``req`` stopped decoding here before its first step (aborted)."""
        if req in self.fresh:
            self.fresh.remove(req)

    def prune(self, running: Collection[Request]) -> None:
        """Forget history that none of the ``running`` requests can ask for any more."""
        if not running:
            self._steps.clear()
            self._peaks.clear()
        elif len(self._steps) > _PRUNE_AT:
            cut = bisect_left(self._steps, min(r.gap_step for r in running))
            del self._steps[:cut], self._peaks[:cut]

    def _push(self, step: int, gap: float) -> None:
        while self._peaks and self._peaks[-1] <= gap:
            self._peaks.pop()
            self._steps.pop()
        self._steps.append(step)
        self._peaks.append(gap)
