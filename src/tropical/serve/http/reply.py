"""One response written from its choices' events: a whole body, or an SSE stream.

A request with ``n`` choices runs as ``n`` router requests. Their events are merged into one queue
tagged with the choice's index, so the whole body and the stream read them alike. Logprobs and an
echoed prompt are laid out here, from the token ids the events carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tropical.core.sampling import TokenLogprobs
from tropical.serve.http.logprobs import chat_logprobs, completion_logprobs
from tropical.serve.http.protocol import (
    SSE_DONE,
    APIError,
    Choice,
    GenerationRequest,
    completion_body,
    sse,
    stream_chunk,
    usage_chunk,
)
from tropical.serve.streams import Event, RequestHandle

if TYPE_CHECKING:
    from tropical.engine.tokenizer import Tokenizer

PATH_HEADER = "x-tropical-path"
DISCONNECT_POLL_S = 0.5


@dataclass
class ChoiceText:
    """What one choice has produced so far: its text, its logprob entries (with the token ids they
    score), where its first token's text starts (``offset``) and where the next one's will
    (``end``), for completions' text_offset."""

    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    end: int = 0
    started: bool = False


class Reply:
    """The events of a request's choices (``handles``, in index order) written as one response."""

    def __init__(self, handles: list[RequestHandle], gen: GenerationRequest, model: str, request_id: str,
                 tokenizer: Tokenizer, abort: Callable[[int], None]) -> None:
        self.gen, self.model, self.id = gen, model, request_id
        self.handles: list[RequestHandle] = []
        self.tokenizer, self.abort = tokenizer, abort
        self.created = int(time.time())
        self.polled = time.monotonic()
        self.events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.choices: list[ChoiceText] = []
        self.texts: dict[int, str] = {}
        self.forwarders: list[asyncio.Task] = []
        self.held: list[tuple[int, Event]] = []
        for handle in handles:
            self.follow(handle)

    def follow(self, handle: RequestHandle) -> None:
        """Add a choice: forward its events into the merged queue, tagged with its index."""
        index = len(self.handles)
        self.handles.append(handle)
        self.choices.append(ChoiceText())

        async def forward() -> None:
            event = await handle.events.get()
            self.events.put_nowait((index, event))
            while not event.final:
                event = await handle.events.get()
                self.events.put_nowait((index, event))
        self.forwarders.append(asyncio.create_task(forward()))

    def hold(self, got: tuple[int, Event]) -> None:
        """Put back an event taken early (the first, read to choose the response's status)."""
        self.held.append(got)

    async def get(self) -> tuple[int, Event]:
        return self.held.pop(0) if self.held else await self.events.get()

    def headers(self) -> dict[str, str]:
        req = self.handles[0].req
        return {PATH_HEADER: req.path.value, "x-request-id": self.id,
                "x-tropical-prefill-worker": str(req.prefill_worker), "x-tropical-reason": req.reason}

    def abort_all(self) -> None:
        """Stop every choice still running (a client gone, or a failed sibling)."""
        for handle in self.handles:
            if not handle.ended:
                self.abort(handle.req.id)
        for task in self.forwarders:
            task.cancel()

    async def next_event(self, request: Request) -> tuple[int, Event] | None:
        """The next (choice, event), or None if the client hung up meanwhile (every choice is then
        aborted). The client is asked every DISCONNECT_POLL_S even while events keep coming, so a
        request whose client left stops generating promptly however fast it runs."""
        if self.held:
            return self.held.pop(0)
        while True:
            if time.monotonic() >= self.polled + DISCONNECT_POLL_S:
                self.polled = time.monotonic()
                if await request.is_disconnected():
                    self.abort_all()
                    return None
            wait = self.polled + DISCONNECT_POLL_S - time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self.events.get(), wait)

    async def whole(self, request: Request) -> Response:
        """Every choice in one body, once each has its final event (499 if the client left)."""
        finish: dict[int, str] = {}
        while len(finish) < len(self.handles):
            got = await self.next_event(request)
            if got is None:
                return Response(status_code=499)
            index, event = got
            if event.error is not None:
                self.abort_all()
                raise APIError(event.status, event.error, "server_error")
            self.take(index, event)
            if event.final:
                finish[index] = event.finish_reason or "stop"
        choices = [Choice("".join(c.text), finish[i], self.logprobs_of(c))
                   for i, c in enumerate(self.choices)]
        body = completion_body(self.id, self.model, self.created, choices, self.handles[0].req.prompt_len,
                               self.completion_tokens, self.gen.chat, self.handles[0].req.cached)
        return JSONResponse(body, headers=self.headers())

    async def stream(self, request: Request) -> AsyncIterator[bytes]:
        """SSE chunks, each choice's in its order; if the client goes away mid-stream every choice
        is aborted and its KV freed."""
        ended = 0
        try:
            while ended < len(self.handles):
                index, event = await self.get()
                if event.error is not None:
                    yield sse(APIError(event.status, event.error, "server_error").body())
                    break
                chunk = self.chunk(index, event)
                if chunk is not None:
                    yield sse(chunk)
                ended += event.final
            if self.gen.include_usage:
                yield sse(usage_chunk(self.id, self.model, self.created, self.handles[0].req.prompt_len,
                                      self.completion_tokens, self.gen.chat, self.handles[0].req.cached))
            yield SSE_DONE
        finally:
            self.abort_all()

    def chunk(self, index: int, event: Event) -> dict | None:
        """Choice ``index``'s chunk for ``event`` (None for an empty middle one)."""
        choice = self.choices[index]
        first = not choice.started
        before = len(choice.text), len(choice.logprobs), choice.end
        self.take(index, event)
        if not (event.text or event.final or first):
            return None
        piece = ChoiceText(choice.text[before[0]:], choice.logprobs[before[1]:], choice.tokens[before[1]:],
                           before[2])
        return stream_chunk(self.id, self.model, self.created, "".join(piece.text), event.finish_reason,
                            self.gen.chat, first=first, tokens=event.tokens, index=index,
                            logprobs=self.logprobs_of(piece))

    def take(self, index: int, event: Event) -> None:
        """Add ``event`` to its choice: the echoed prompt first (with the prompt's logprobs), then
        the event's text and logprobs."""
        choice = self.choices[index]
        if not choice.started:
            choice.started = True
            if self.gen.sampling.echo:
                self.echo(choice, event)
        choice.text.append(event.text)
        if self.gen.sampling.logprobs is not None:
            self.add_logprobs(choice, event.logprobs, [e.token for e in event.logprobs])

    def echo(self, choice: ChoiceText, first: Event) -> None:
        prompt = self.handles[0].submission.prompt_ids
        echoed = self.gen.prompt if isinstance(self.gen.prompt, str) else self.tokenizer.decode(prompt)
        choice.text.append(echoed)
        if self.gen.sampling.logprobs is not None:
            self.add_logprobs(choice, first.prompt_logprobs or [None] * len(prompt), prompt)

    def add_logprobs(self, choice: ChoiceText, entries: list, tokens: list[int]) -> None:
        choice.logprobs.extend(entries)
        choice.tokens.extend(tokens)
        choice.end += sum(len(self.text_of(t)) for t in tokens)

    def logprobs_of(self, choice: ChoiceText) -> dict | None:
        """The choice's (or a piece's) logprobs in the endpoint's shape."""
        k = self.gen.sampling.logprobs
        if k is None:
            return None
        if self.gen.chat:
            return chat_logprobs([e for e in choice.logprobs if e is not None], k, self.text_of)
        return completion_logprobs(choice.logprobs, choice.tokens, k, self.text_of, choice.offset)

    def text_of(self, token: int) -> str:
        """A token's text as vLLM shows it beside its logprob: the token decoded alone."""
        text = self.texts.get(token)
        if text is None:
            text = self.texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    @property
    def completion_tokens(self) -> int:
        return sum(h.completion_tokens for h in self.handles)
