"""TPOT slack: may a decoding batch absorb a longer iteration without missing its TPOT SLOs?

``iteration``: the paper's rule: the stretched iteration itself must fit every decoding
request's TPOT SLO. ``banked``: a request may also spend the time it saved so far: after the
iteration it must still have produced its tokens within tokens × TPOT SLO of its first token.
Both guarantee that, with an exact predictor, a multiplexed prefill never makes a decoding
request miss its TPOT SLO as long as plain decode iterations fit the SLO.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def fits_tpot(decodes: Iterable[Decoding], iteration: float, start: float, rule: SlackRule) -> bool:
    """Would an iteration of ``iteration`` seconds starting at ``start`` keep every TPOT SLO?"""
    if rule is SlackRule.ITERATION:
        return all(iteration <= d.request.slo.tpot for d in decodes)
    end = start + iteration
    return all(end - d.first_token <= d.generated * d.request.slo.tpot for d in decodes)
