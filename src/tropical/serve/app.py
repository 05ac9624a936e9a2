"""The HTTP face: OpenAI-compatible endpoints over the router, plus /health and /metrics.

Handlers only translate: wire format in (``protocol``), tokens (``prompts``), the router's
events out. A streamed response starts once the first token exists, so its headers can say which
path the request took and a request that fails before any output gets a proper error status.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tropical.serve.metrics import ServerMetrics
from tropical.serve.prompts import to_submission
from tropical.serve.protocol import (
    SSE_DONE,
    APIError,
    GenerationRequest,
    completion_body,
    models_body,
    parse_chat,
    parse_completion,
    sse,
    stream_chunk,
    usage_chunk,
)
from tropical.serve.router import Rejected, Router
from tropical.serve.streams import Event, RequestHandle

PATH_HEADER = "x-tropical-path"
DISCONNECT_POLL_S = 0.5


@dataclass
class ServerState:
    """What the endpoints need once start-up is done; ``router`` is None until then."""

    model_id: str
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    router: Router | None = None
    max_model_len: int = 0
    created: int = 0


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register every endpoint on ``app``, reading the router from ``state``."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.get("/health")
    async def health() -> JSONResponse:
        router = state.router
        workers = [] if router is None else [
            {"id": w.id, "role": w.role.value, "pid": c.pid, "node": c.node, "alive": c.alive}
            for w, c in zip(router.workers, router.clients, strict=True)]
        ok = router is not None and any(w["alive"] for w in workers) and not router.draining
        return JSONResponse({"status": "ok" if ok else "unavailable", "workers": workers},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(state, request)
        return JSONResponse(models_body([state.model_id], state.max_model_len, state.created))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(state, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(state, request, parse_chat)


def ready(state: ServerState) -> Router:
    if state.router is None:
        raise APIError(503, "the server is starting; try again when /health says ok", "server_error")
    return state.router


def authorize(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    if header != f"Bearer {state.api_key}":
        raise APIError(401, "incorrect or missing API key (send 'Authorization: Bearer <key>')",
                       "authentication_error", code="invalid_api_key")


async def generate(state: ServerState, request: Request,
                   parse: Callable[[bytes, dict], GenerationRequest]) -> Response:
    authorize(state, request)
    router = ready(state)
    gen = parse(await request.body(), dict(request.headers))
    if gen.model != state.model_id:
        raise APIError(404, f"model {gen.model!r} does not exist; this server serves {state.model_id!r}",
                       "not_found_error", param="model", code="model_not_found")
    submission = to_submission(gen, router.tokenizer, state.max_model_len)
    try:
        handle = router.submit(submission)
    except Rejected as exc:
        kind = "rate_limit_exceeded" if exc.status == 429 else (
            "invalid_request_error" if exc.status == 400 else "server_error")
        raise APIError(exc.status, exc.reason, kind) from exc
    reply = Reply(state, router, handle, gen, f"{'chatcmpl' if gen.chat else 'cmpl'}-{uuid.uuid4().hex}")
    try:
        first = await reply.next_event(request)
    except BaseException:
        router.abort(handle.req.id)
        raise
    if first is None:
        return Response(status_code=499)
    if first.error is not None:
        raise APIError(500, first.error, "server_error")
    if gen.stream:
        return StreamingResponse(reply.stream(request, first), media_type="text/event-stream",
                                 headers=reply.headers())
    return await reply.whole(request, first)


class Reply:
    """One response being written from a request's events."""

    def __init__(self, state: ServerState, router: Router, handle: RequestHandle, gen: GenerationRequest,
                 request_id: str) -> None:
        self.state, self.router, self.handle, self.gen, self.id = state, router, handle, gen, request_id
        self.created = int(time.time())

    def headers(self) -> dict[str, str]:
        req = self.handle.req
        return {PATH_HEADER: req.path.value, "x-request-id": self.id,
                "x-tropical-prefill-worker": str(req.prefill_worker), "x-tropical-reason": req.reason}

    async def next_event(self, request: Request) -> Event | None:
        """The next event, or None if the client hung up meanwhile (the request is then aborted)."""
        while True:
            try:
                return await asyncio.wait_for(self.handle.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.router.abort(self.handle.req.id)
                    return None

    async def whole(self, request: Request, first: Event) -> Response:
        parts, event = [first.text], first
        while not event.final:
            event = await self.next_event(request)
            if event is None:
                return Response(status_code=499)
            parts.append(event.text)
        if event.error is not None:
            raise APIError(500, event.error, "server_error")
        body = completion_body(self.id, self.state.model_id, self.created, "".join(parts),
                               event.finish_reason or "stop", self.handle.req.prompt_len,
                               self.handle.completion_tokens, self.gen.chat)
        return JSONResponse(body, headers=self.headers())

    async def stream(self, request: Request, first: Event) -> AsyncIterator[bytes]:
        """SSE chunks; if the client goes away mid-stream the request is aborted and its KV freed."""
        chat, model, event, index = self.gen.chat, self.state.model_id, first, 0
        try:
            while True:
                if event.error is not None:
                    yield sse(APIError(500, event.error, "server_error").body())
                    break
                if event.text or event.final or index == 0:
                    yield sse(stream_chunk(self.id, model, self.created, event.text, event.finish_reason,
                                           chat, first=index == 0, tokens=event.tokens))
                    index += 1
                if event.final:
                    break
                event = await self.handle.events.get()
            if self.gen.include_usage:
                yield sse(usage_chunk(self.id, model, self.created, self.handle.req.prompt_len,
                                      self.handle.completion_tokens, chat))
            yield SSE_DONE
        finally:
            if not self.handle.ended:
                self.router.abort(self.handle.req.id)
