"""What the client saw of one request, and the same request as the simulator's ``Request``.

Turning a measurement into a ``Request`` (arrival = send time, first token = first streamed
chunk, finish = last chunk that carries tokens, output length = completion tokens) lets
``tropical.core.metrics`` compute TTFT, TPOT and attainment for bench exactly as for sim.

Two latencies between tokens, each named for what it is (the simulator uses the same
definitions): *inter-chunk gaps* are the times between consecutive chunks that carry tokens,
what a reader of the stream feels; *per-token ITL* spreads each gap evenly over the tokens its
chunk carries (k tokens after a gap g give k values g/k). The server may say how many tokens a
chunk carries (``"tokens"`` in the choice, as ours does); otherwise the count is estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tropical.core.metrics import STALL_S
from tropical.core.request import Request
from tropical.core.slo import SLO


@dataclass(slots=True)
class Measurement:
    """Client-side timings of one request, in seconds since the run started.

    ``chunks`` are the arrival times of chunks that carry tokens and ``chunk_tokens`` their token
    counts as the server stated them (None where it did not); ``path``, ``prefill_worker`` and
    ``reason`` are Tropical's ``x-tropical-path`` / ``-prefill-worker`` / ``-reason`` response
    headers (the policy's decision when the response began), if sent. ``usage_prompt_tokens`` and
    ``cached_tokens`` are the server's usage: the prompt as it counted it, and the tokens of it
    its prefix cache held (``prompt_tokens_details.cached_tokens``), if it said.
    """

    id: int
    prompt_len: int
    max_tokens: int
    sent: float = 0.0
    chunks: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)
    usage_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    cached_tokens: int | None = None
    saw_done: bool = False
    error: str | None = None
    end: float = 0.0
    path: str | None = None
    prefill_worker: str | None = None
    reason: str | None = None

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's usage count, else its per-chunk counts, else chunks."""
        if self.usage_tokens is not None:
            return self.usage_tokens
        stated = self._stated()
        return sum(stated) if stated is not None else len(self.chunks)

    @property
    def counted(self) -> bool:
        """Whether the server stated every chunk's token count (no estimate needed)."""
        return self._stated() is not None

    def _stated(self) -> list[int] | None:
        """Every chunk's token count as the server stated it; None if some chunk did not say."""
        stated = [k for k in self.chunk_tokens if k is not None]
        return stated if len(stated) == len(self.chunk_tokens) == len(self.chunks) else None

    def add_chunk(self, now: float, tokens: int | None) -> None:
        self.chunks.append(now)
        self.chunk_tokens.append(tokens)

    def close(self, now: float) -> None:
        """Stop waiting; a stream that ended early or empty is a failure, not a short request."""
        self.end = now
        if self.error is None and not self.saw_done:
            self.error = "stream ended without [DONE]"
        elif self.error is None and not self.chunks:
            self.error = "stream ended without tokens"

    def chunk_gaps(self) -> list[float]:
        """Gaps between consecutive chunks that carry tokens."""
        return np.diff(self.chunks).tolist()

    def token_counts(self) -> list[int]:
        """Tokens per chunk: as the server stated them, else estimated (see ``estimated_counts``)."""
        stated = self._stated()
        return stated if stated is not None else estimated_counts(self.tokens, self.chunk_gaps())

    def itls(self) -> list[float]:
        """Per-token inter-token latencies: each gap g before a chunk of k tokens gives k values g/k."""
        counts = self.token_counts()[1:]
        return [g / k for g, k in zip(self.chunk_gaps(), counts, strict=True) for _ in range(k)]

    def stalled(self) -> bool:
        return any(g > STALL_S for g in self.chunk_gaps())

    def to_request(self, slo: SLO) -> Request:
        req = Request(self.id, self.sent, self.prompt_len, max(1, self.tokens), slo)
        if self.error is not None:
            req.fail(self.end, self.error)
        else:
            req.first_token, req.finish, req.generated = self.chunks[0], self.chunks[-1], self.tokens
            req.max_gap = max(self.chunk_gaps(), default=0.0)
        return req


def estimated_counts(tokens: int, gaps: list[float]) -> list[int]:
    """Token counts of a stream whose server does not state them: ``tokens`` spread over the chunks.

    The first chunk carries one token; the rest are split as evenly as integers allow over the
    later chunks, an extra token going to the chunks after the longest gaps (a chunk that waited
    longer is the likelier to hold a token that produced no text of its own).
    """
    later = max(0, tokens - 1)
    if not gaps:
        return [max(1, tokens)]
    base, extra = divmod(later, len(gaps))
    counts = [base] * len(gaps)
    for i in np.argsort(gaps, kind="stable")[::-1][:extra]:
        counts[i] += 1
    return [1, *counts]
