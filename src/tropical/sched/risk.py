"""Whether a prefill queue holds a prompt that Path 2 could still save, found without adding up
the whole queue at every iteration end.

A queued prompt is *at risk* when its predicted Path 1 finish (its worker free from ``start``,
then every prompt ahead of it, then its own) misses its TTFT SLO, and *doomed* when it would
miss even if it started now, alone. A doomed prompt is also at risk, and stays doomed as time
passes; so each prompt of a queue, priced once per queue state, is checked for doom until it
is, and only the others are checked for risk, against sums of the costs kept from zero. Those
sums round differently from the toggle's own (added up from ``start``), so a prompt counts as
safe only by a margin far above any rounding; one in doubt sends the caller to the exact scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

from tropical.core.request import Request

MARGIN = 1e-9
"""Relative margin for "surely not at risk": sums of n costs round by about n·2⁻⁵³ of their
size, under 1e-10 even for a million prompts."""


def doomed(req: Request, cost: float, now: float) -> bool:
    """Would ``req``, costing ``cost`` here, miss its TTFT SLO even if it started ``now``?"""
    return now + cost - req.arrival > req.slo.ttft


@dataclass(slots=True)
class QueueRisk:
    """One priced queue (``priced``: (prompt, cost) in queue order), the running sums of its
    costs, and the positions of the prompts not yet doomed at ``since``."""

    priced: tuple[tuple[Request, float], ...]
    totals: list[float]
    open: list[int]
    since: float = -math.inf

    @classmethod
    def of(cls, priced: tuple[tuple[Request, float], ...]) -> QueueRisk:
        return cls(priced, list(accumulate(cost for _, cost in priced)), list(range(len(priced))))

    def none_to_save(self, start: float, now: float) -> bool:
        """True only if no prompt here is at risk without being doomed at ``now`` (its worker
        free from ``start``); False if one is, or may be."""
        if now < self.since:
            self.open = list(range(len(self.priced)))
        self.since = now
        priced, totals = self.priced, self.totals
        self.open = [i for i in self.open if not doomed(*priced[i], now)]
        for i in self.open:
            req = priced[i][0]
            late = start + totals[i] - req.arrival - req.slo.ttft
            if late > -MARGIN * (abs(start) + totals[i] + abs(req.arrival) + req.slo.ttft):
                return False
        return True

    @property
    def doomed_count(self) -> int:
        """Prompts doomed at ``since`` (all of them at risk)."""
        return len(self.priced) - len(self.open)
