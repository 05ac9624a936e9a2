"""The tightest TTFT SLO a multiplexing worker stays ready for, and how long an iteration it allows.

A prompt that Path 2 sends to a multiplexing worker starts at that worker's next iteration
boundary: one arriving while an iteration runs waits for it to end, then computes in the next,
beside the decodes. The TPOT SLO bounds how long a multiplexing iteration that carries prompt
chunks may run; under a loose one (10x, 20x) that is several times the TTFT SLO of the shortest
prompts, which then have no worker that can serve them in time, and are demoted on Path 1. On
synthetic at rate scale 0.5 `tropical+` attained 91.79 / 88.98 / 88.63% at TPOT 5x / 10x / 20x,
the misses at 20x mostly prompts of about 50 tokens (docs/overload.md). So such an iteration
also ends within what the tightest TTFT SLO seen leaves once that prompt's own iteration is
paid: an arrival as tight then waits for one iteration and still meets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tropical.core.latency.iterations import prefill_time
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request


@dataclass(slots=True, eq=False)
class TightestPrompt:
    """The tightest TTFT SLO among the arrivals seen (``ttft``; ties: the longest prompt) and
    that prompt's length. Only a prompt whose SLO is at least twice its own prefill, alone,
    counts: one that could not wait an iteration as long as its own would leave no room for a
    chunk (a hopeless SLO of a millisecond would stop every multiplexing worker's prefill).
    Shared by a policy and its multiplexing workers' batch rules: the batches form as Path 2
    priced them."""

    ttft: float = math.inf
    prompt_len: int = 0

    def saw(self, req: Request, latency: LatencyModel) -> bool:
        """Take ``req`` as the tightest if it is (its prefill alone priced by ``latency`` only
        then: most arrivals are not); True if the tightest changed."""
        if (req.slo.ttft, -req.prompt_len) >= (self.ttft, -self.prompt_len):
            return False
        if req.slo.ttft < 2 * prefill_time(latency, req.prompt_len):
            return False
        self.ttft, self.prompt_len = req.slo.ttft, req.prompt_len
        return True

    def room(self, latency: LatencyModel, decode: BatchShape, limit: float) -> float:
        """How long an iteration beside ``decode`` that carries prompt chunks may run, given the
        decodes' own ``limit``: what the tightest TTFT SLO leaves after that prompt's own
        iteration beside them, where that is less than ``limit`` and no less than the prompt's
        own iteration (else ``limit``: a heavier decode batch leaves too little to be worth it)."""
        if self.ttft == math.inf:
            return limit
        own = latency.iteration_time(decode.plus_prefill(self.prompt_len, 0))
        room = self.ttft - own
        return room if own <= room < limit else limit
