"""TPOT slack: may a decoding batch absorb a longer iteration without missing its TPOT SLOs?

``iteration``: the paper's rule: the stretched iteration itself must fit every decoding
request's TPOT SLO. ``banked``: a request may also spend the time it saved so far: after the
iteration it must still have produced its tokens within tokens × TPOT SLO of its first token.
Both guarantee that, with an exact predictor, a multiplexed prefill never makes a decoding
request miss its TPOT SLO as long as plain decode iterations fit the SLO.
"""

from __future__ import annotations

from enum import Enum

from tropical.sched.worker import WorkerState


class SlackRule(str, Enum):
    ITERATION = "iteration"
    BANKED = "banked"


def fits_tpot(worker: WorkerState, iteration: float, start: float, rule: SlackRule,
              steps_ahead: int = 0) -> bool:
    """Would an iteration of ``iteration`` seconds starting at ``start`` keep every TPOT SLO?

    ``steps_ahead`` counts decode iterations that run before it (1 while one is in flight).
    """
    if rule is SlackRule.ITERATION:
        return all(iteration <= req.slo.tpot for req in worker.running.values())
    end = start + iteration
    for req in worker.running.values():
        generated = worker.generated(req) + steps_ahead
        if end - req.first_token > generated * req.slo.tpot:
            return False
    return True
