"""A request as the HTTP layer sees it: the events its generation produces, in order.

The router pushes events; the endpoint that owns the client connection consumes them. Text is
detokenized on the router side, so stop strings end generation (and free KV) where it runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.slo import SLO, SLOSpec
from tropical.engine.sampling import SamplingParams
from tropical.serve.detokenize import Decoder, TextStream


@dataclass(frozen=True, slots=True)
class Submission:
    """A validated generation request in tokens; ``max_tokens`` is already fitted to the context;
    ``retry``: start over on another worker if its worker dies before it streams anything."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: list[str]
    ignore_eos: bool
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    retry: bool = True

    def slo(self, default: SLOSpec, reference: LatencyModel) -> SLO:
        """Its own SLO fields where given, else the server's default for its prompt length."""
        base = default.resolve(len(self.prompt_ids), reference)
        ttft, tpot = self.slo_ttft_ms, self.slo_tpot_ms
        return SLO(base.ttft if ttft is None else ttft / 1e3, base.tpot if tpot is None else tpot / 1e3)


@dataclass(frozen=True, slots=True)
class Event:
    """New text and how many tokens produced it; the last event has ``finish_reason`` ("stop",
    "length") or ``error``."""

    text: str
    tokens: int
    finish_reason: str | None = None
    error: str | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass(eq=False)
class RequestHandle:
    """One request in flight: its scheduling record, its text stream and its event queue."""

    req: Request
    submission: Submission
    text: TextStream
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    completion_tokens: int = 0
    ended: bool = False

    @classmethod
    def of(cls, req: Request, submission: Submission, tokenizer: Decoder) -> RequestHandle:
        return cls(req, submission, TextStream(tokenizer, submission.stop))

    def emit(self, tokens: list[int]) -> bool:
        """Stream newly sampled tokens; True when a stop string ended the text."""
        self.completion_tokens += len(tokens)
        delta = self.text.push(tokens)
        if delta or not self.text.stopped:
            self.events.put_nowait(Event(delta, len(tokens)))
        return self.text.stopped

    def end(self, finish_reason: str | None = None, error: str | None = None) -> None:
        """The final event (once): what the stream still held, and why it ended."""
        if self.ended:
            return
        self.ended = True
        tail = self.text.finish() if error is None else ""
        reason = "stop" if self.text.stopped else finish_reason
        self.events.put_nowait(Event(tail, 0, None if error else reason, error))
