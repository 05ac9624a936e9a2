"""What the client saw of one request, and the same request as the simulator's ``Request``.

Turning a measurement into a ``Request`` (arrival = send time, first token = first streamed
chunk, finish = last streamed chunk, output length = completion tokens) lets
``tropical.core.metrics`` compute TTFT, TPOT and attainment for bench exactly as for sim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tropical.core.request import Request
from tropical.core.slo import SLO


@dataclass(slots=True)
class Measurement:
    """Client-side timings of one request, in seconds since the run started."""

    id: int
    prompt_len: int
    max_tokens: int
    sent: float = 0.0
    chunks: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    saw_done: bool = False
    error: str | None = None
    end: float = 0.0

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage count when it sent one, else streamed chunks."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunks)

    def close(self, now: float) -> None:
        """Stop waiting; a stream that ended early or empty is a failure, not a short request."""
        self.end = now
        if self.error is None and not self.saw_done:
            self.error = "stream ended without [DONE]"
        elif self.error is None and not self.chunks:
            self.error = "stream ended without tokens"

    def itls(self) -> list[float]:
        """Gaps between consecutive streamed chunks (a chunk may carry several tokens)."""
        return np.diff(self.chunks).tolist()

    def to_request(self, slo: SLO) -> Request:
        req = Request(self.id, self.sent, self.prompt_len, max(1, self.tokens), slo)
        if self.error is not None:
            req.fail(self.end, self.error)
        else:
            req.first_token, req.finish, req.generated = self.chunks[0], self.chunks[-1], self.tokens
        return req
