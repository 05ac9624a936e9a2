"""TPOT slack: may a decoding batch absorb a longer iteration without missing its TPOT SLOs?

``iteration``: the paper's rule: the stretched iteration itself must fit every decoding
request's TPOT SLO. ``banked``: a request may also spend the time it saved so far: after the
iteration it must still have produced its tokens within tokens × TPOT SLO of its first token.
Both guarantee that, with an exact predictor, a multiplexed prefill never makes a decoding
request miss its TPOT SLO as long as plain decode iterations fit the SLO. Under ``iteration`` a
long prompt need not wait for a whole iteration's worth of slack: chunked multiplexing feeds it
in the largest chunk that fits each iteration (``largest_chunk``), so no gap between two tokens
grows past the TPOT SLO either; and since a request that migrates in has already waited for the
iteration in flight, a chunk also never takes an iteration past any decode's banked deadline,
so that each one's final mean stays within its SLO.
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


@dataclass(slots=True)
class Decoding:
    """A request that decodes in the iteration being planned: its SLO, its tokens by the
    iteration's start, and when its first token came. (Not frozen: plans build one per
    decoding request they read one by one, and a frozen one costs three times as much to
    build; ``NextIteration`` prices its running batch without them. It writes its constructor,
    which mypyc compiles, see ``BatchShape``.)"""

    request: Request
    generated: int
    first_token: float

    def __init__(self, request: Request, generated: int, first_token: float) -> None:
        self.request = request
        self.generated = generated
        self.first_token = first_token


@dataclass(slots=True)
class TpotBudget:
    """The tightest TPOT constraint among the decodes of one planned iteration, for both rules:
    the smallest TPOT SLO (per-iteration rule) and the earliest time by which the iteration must
    end for every request to stay within tokens × TPOT SLO of its first token (banked rule).
    A value (not frozen, as ``Decoding``: one is built per planned iteration)."""

    min_tpot: float
    deadline: float

    @classmethod
    def of(cls, decodes: Iterable[Decoding]) -> TpotBudget:
        return cls.of_terms([(d.request.slo.tpot, d.first_token, d.generated) for d in decodes])

    @classmethod
    def of_terms(cls, terms: Iterable[tuple[float, float, int]]) -> TpotBudget:
        """From each decode's (TPOT SLO, first token, tokens by the iteration's start): what
        ``of`` reads, without a Decoding per request where a whole batch is priced."""
        min_tpot = deadline = math.inf
        for tpot, first_token, generated in terms:
            end = first_token + generated * tpot
            if tpot < min_tpot:
                min_tpot = tpot
            if end < deadline:
                deadline = end
        return TpotBudget(min_tpot, deadline)

    def fits(self, iteration: float, start: float, rule: SlackRule) -> bool:
        """Would an iteration of ``iteration`` seconds starting at ``start`` keep every TPOT SLO?"""
        return iteration <= self.limit(start, rule)

    def limit(self, start: float, rule: SlackRule) -> float:
        """The longest iteration starting at ``start`` that keeps every TPOT SLO."""
        return self.min_tpot if rule is SlackRule.ITERATION else self.deadline - start


def largest_chunk(most: int, time_of: Callable[[int], float], limit: float, near: int = 0) -> int:
    """The most prompt tokens, up to ``most``, whose iteration takes at most ``limit`` (0 if
    none). Iteration time grows with the chunk, nearly linearly, so each round guesses along
    the line (through both ends of the bracket once known, else along the slope just priced)
    and checks the neighbour across it: a few predictions, not log(most). ``near``: a guess to
    start from, such as the chunk the worker's previous iteration took; a good one settles
    the search with two predictions. The answer does not depend on it."""
    if most < 1:
        return 0
    lo, hi = 0, most + 1                       # t(lo) <= limit < t(hi); the ends stand for "unknown"
    t_lo = t_hi = 0.0
    guess = min(near, most) if near > 0 else most
    while hi - lo > 1:
        n = min(hi - 1, max(lo + 1, guess))
        t = time_of(n)
        side = n + 1 if t <= limit else n - 1
        lo, t_lo, hi, t_hi = (n, t, hi, t_hi) if t <= limit else (lo, t_lo, n, t)
        slope = 0.0
        if lo < side < hi:
            t_side = time_of(side)
            slope = abs(t_side - t)
            lo, t_lo, hi, t_hi = (side, t_side, hi, t_hi) if t_side <= limit else (lo, t_lo, side, t_side)
        guess = _next_guess(lo, t_lo, hi, t_hi, most, slope, limit)
    return lo


def _next_guess(lo: int, t_lo: float, hi: int, t_hi: float, most: int, slope: float,
                limit: float) -> int:
    """Where the line crosses ``limit``: between both ends of the bracket when both are priced,
    else from the known end along ``slope`` (or the far end of the range without one)."""
    if lo > 0 and hi <= most:
        return lo + int((limit - t_lo) / (t_hi - t_lo) * (hi - lo)) if t_hi > t_lo else lo + 1
    if lo > 0:
        return lo + int((limit - t_lo) / slope) if slope > 0 else most
    return hi - 1 - int((t_hi - limit) / slope) if slope > 0 else 1
