"""TPOT slack: may a decoding batch absorb a longer iteration without missing its TPOT SLOs?

``iteration``: the paper's rule: the stretched iteration itself must fit every decoding
request's TPOT SLO. ``banked``: a request may also spend the time it saved so far: after the
iteration it must still have produced its tokens within tokens × TPOT SLO of its first token.
Both guarantee that, with an exact predictor, a multiplexed prefill never makes a decoding
request miss its TPOT SLO as long as plain decode iterations fit the SLO. Under ``iteration`` a
long prompt need not wait for a whole iteration's worth of slack: chunked multiplexing feeds it
in the largest chunk that fits each iteration (``largest_chunk``), so no gap between two tokens
grows past the TPOT SLO either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from tropical.core.request import Request


class SlackRule(str, Enum):
    ITERATION = "iteration"
    BANKED = "banked"


@dataclass(frozen=True, slots=True)
class Decoding:
    """A request that decodes in the iteration being planned: its SLO, its tokens by the
    iteration's start, and when its first token came."""

    request: Request
    generated: int
    first_token: float


@dataclass(frozen=True, slots=True)
class TpotBudget:
    """The tightest TPOT constraint among the decodes of one planned iteration, for both rules:
    the smallest TPOT SLO (per-iteration rule) and the earliest time by which the iteration must
    end for every request to stay within tokens × TPOT SLO of its first token (banked rule)."""

    min_tpot: float
    deadline: float

    @classmethod
    def of(cls, decodes: Iterable[Decoding]) -> TpotBudget:
        min_tpot = deadline = math.inf
        for d in decodes:
            min_tpot = min(min_tpot, d.request.slo.tpot)
            deadline = min(deadline, d.first_token + d.generated * d.request.slo.tpot)
        return cls(min_tpot, deadline)

    def fits(self, iteration: float, start: float, rule: SlackRule) -> bool:
        """Would an iteration of ``iteration`` seconds starting at ``start`` keep every TPOT SLO?"""
        if rule is SlackRule.ITERATION:
            return iteration <= self.min_tpot
        return start + iteration <= self.deadline


def largest_chunk(most: int, fits: Callable[[int], bool]) -> int:
    """The most prompt tokens, up to ``most``, whose iteration still ``fits`` (0 if none):
    iteration time grows with the chunk, so a bisection finds it in O(log most) predictions."""
    if most < 1 or not fits(1):
        return 0
    if fits(most):
        return most
    lo, hi = 1, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
