"""A request as the HTTP layer sees it: the events its generation produces, in order.

The router pushes events; the endpoint that owns the client connection consumes them. Text is
detokenized on the router side, so stop strings end generation (and free KV) where it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tropical.core.latency.model import LatencyModel
from tropical.core.request import Request
from tropical.core.sampling import SamplingParams, TokenLogprobs
from tropical.core.slo import SLO, SLOSpec
from tropical.sched.step import TokenConstraint
from tropical.serve.detokenize import Decoder, TextStream


@dataclass(frozen=True, slots=True)
class Submission:
    """A validated generation request in tokens; ``max_tokens`` is already fitted to the context;
    ``retry``: start over on another worker if its worker dies before it streams anything;
    ``constraint``: makes a fresh grammar matcher for each run of the request (structured outputs)."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: list[str]
    ignore_eos: bool
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    retry: bool = True
    constraint: Callable[[], TokenConstraint] | None = None

    def slo(self, default: SLOSpec, reference: LatencyModel) -> SLO:
        """Its own targets where it names them (ms, as SLOSpec takes them), else the server's
        default for its prompt length."""
        named = {"ttft_ms": self.slo_ttft_ms, "tpot_ms": self.slo_tpot_ms}
        spec = replace(default, **{k: v for k, v in named.items() if v is not None})
        return spec.resolve(len(self.prompt_ids), reference)


@dataclass(frozen=True, slots=True)
class Event:
    """New text and how many tokens produced it (streamed to clients as each chunk's ``tokens``, so
    a benchmark can tell per-token latency from gaps between chunks); the last event has
    ``finish_reason`` ("stop", "length") or ``error``, with the HTTP ``status`` that error maps to
    (503: the server could not serve it now, e.g. its worker died; 500: an internal failure).
    ``logprobs``: one entry per token the event carries, in order, when the request asked for them;
    ``prompt_logprobs``: on the first event of a request that asked for them, one entry per prompt
    token, the first None (nothing precedes it)."""

    text: str
    tokens: int
    finish_reason: str | None = None
    error: str | None = None
    status: int = 500
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None

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
    unsent_tokens: int = 0  # sampled tokens no event has carried yet: their text is held back
    unsent_logprobs: list[TokenLogprobs] = field(default_factory=list)  # and their logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # for the first event
    ended: bool = False

    @classmethod
    def of(cls, req: Request, submission: Submission, tokenizer: Decoder) -> RequestHandle:
        return cls(req, submission, TextStream(tokenizer, submission.stop))

    def emit(self, tokens: list[int], logprobs: list[TokenLogprobs] | None = None,
             prompt_logprobs: list[TokenLogprobs | None] | None = None, silent: bool = False) -> bool:
        """Stream newly sampled tokens, with their ``logprobs`` if the request asked for them (and
        with the first, its ``prompt_logprobs``); True when a stop string ended the text.
        ``silent``: count the tokens but add no text (a stop token id ends the request unseen).

        An event goes out when there is text, and for the first token even without (it marks the
        first token's time); tokens whose text is held back ride with the next event.
        """
        first = self.completion_tokens == 0
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs
        self.completion_tokens += len(tokens)
        self.unsent_tokens += len(tokens)
        self.unsent_logprobs.extend(logprobs or ())
        delta = "" if silent else self.text.push(tokens)
        if delta or (first and not self.text.stopped):
            self.events.put_nowait(self._event(delta))
        return self.text.stopped

    def _event(self, text: str, finish_reason: str | None = None) -> Event:
        """An event carrying ``text`` and every token not carried yet (with their logprobs; the
        first event also with the prompt's)."""
        event = Event(text, self.unsent_tokens, finish_reason, logprobs=self.unsent_logprobs,
                      prompt_logprobs=self.prompt_logprobs)
        self.unsent_tokens, self.unsent_logprobs, self.prompt_logprobs = 0, [], None
        return event

    def end(self, finish_reason: str | None = None, error: str | None = None, status: int = 500) -> None:
        """The final event (once): what the stream still held, and why it ended.

        An event the reader has not taken yet (the last token's, emitted in the same step) is folded
        into the final one, so the finish reason rides with the last tokens as in vLLM's streams
        instead of in a chunk of its own right behind them.
        """
        if self.ended:
            return
        self.ended = True
        if error is not None:
            self.events.put_nowait(Event("", 0, None, error, status))
            return
        tail = self.text.finish()
        reason = "stop" if self.text.stopped else finish_reason
        last = self._take_unread_last() or Event("", 0)
        event = self._event(last.text + tail, reason)
        self.events.put_nowait(replace(event, tokens=last.tokens + event.tokens,
                                       logprobs=last.logprobs + event.logprobs,
                                       prompt_logprobs=last.prompt_logprobs or event.prompt_logprobs))

    def _take_unread_last(self) -> Event | None:
        """Remove and return the newest queued event, leaving the older ones queued in order."""
        queued = []
        while not self.events.empty():
            queued.append(self.events.get_nowait())
        for event in queued[:-1]:
            self.events.put_nowait(event)
        return queued[-1] if queued else None
