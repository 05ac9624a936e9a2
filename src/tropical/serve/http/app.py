"""The HTTP face: OpenAI-compatible endpoints over the router, plus /health and /metrics.

Handlers only translate: wire format in (``protocol``), tokens (``prompts``), the router's
events out. A streamed response starts once the first token exists, so its headers can say which
path the request took and a request that fails before any output gets a proper error status.

Nothing a client sends may stall the event loop every request shares: bodies are read with a size
cap, then parsed and tokenized in a thread (after a cheap length check).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from tropical.sched.worker import WorkerState
from tropical.serve.http.auth import key_matches
from tropical.serve.http.prompts import Limits, to_submission
from tropical.serve.http.protocol import (
    APIError,
    GenerationRequest,
    models_body,
    parse_chat,
    parse_completion,
    shown,
)
from tropical.serve.http.reply import Reply
from tropical.serve.metrics import ServerMetrics
from tropical.serve.router import Rejected
from tropical.serve.streams import RequestHandle, Submission

if TYPE_CHECKING:  # the tokenizer's module loads torch (GGUF vocabularies); the endpoints need only its type
    from tropical.engine.tokenizer import Tokenizer

MIB = 1 << 20


class WorkerInfo(Protocol):
    """What /health shows of a worker: a WorkerHandle, or a vLLM instance."""

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def node(self) -> str: ...


class ServingRouter(Protocol):
    """What the endpoints and the server need of a router, so the native one (``router.Router``)
    and the one over vLLM instances (``vllm.driver.VllmDriver``) serve alike."""

    @property
    def workers(self) -> Sequence[WorkerState]: ...

    @property
    def clients(self) -> Sequence[WorkerInfo]: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def unavailable(self) -> str | None: ...

    def submit(self, submission: Submission) -> RequestHandle: ...

    def abort(self, rid: int) -> None: ...

    async def drain(self, timeout: float) -> None: ...


@dataclass
class ServerState:
    """What the endpoints need once start-up is done; ``router`` is None until then."""

    model_id: str
    api_key: str | None = None
    max_body_bytes: int = 4 * MIB
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    router: ServingRouter | None = None
    limits: Limits = field(default_factory=Limits)
    created: int = 0


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register every endpoint on ``app``, reading the router from ``state``."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        """Unknown paths and methods get OpenAI's error shape too, not FastAPI's {"detail": ...}."""
        status = exc.status_code
        kind = "not_found_error" if status == 404 else (
            "invalid_request_error" if status < 500 else "server_error")
        return error_response(APIError(status, str(exc.detail), kind))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        """A bug still answers in OpenAI's shape (uvicorn logs the traceback; the body names only
        the exception's type)."""
        return error_response(APIError(500, f"internal server error ({type(exc).__name__})", "server_error"))

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        """200 only when a request could be served now; worker PIDs and nodes only with the key."""
        router = state.router
        reason = "starting" if router is None else router.unavailable
        body: dict = {"status": "ok" if reason is None else "unavailable"}
        if reason is not None:
            body["reason"] = reason
        if router is not None:
            full = has_key(state, request)
            body["workers"] = [worker_health(w.id, w.role.value, c, full)
                               for w, c in zip(router.workers, router.clients, strict=True)]
        return JSONResponse(body, status_code=200 if reason is None else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(state, request)
        return JSONResponse(models_body([state.model_id], state.limits.max_model_len, state.created))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(state, request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(state, request, parse_chat)


def worker_health(worker_id: int, role: str, client: WorkerInfo, full: bool) -> dict:
    about: dict = {"id": worker_id, "role": role, "alive": client.alive}
    return {**about, "pid": client.pid, "node": client.node} if full else about


def ready(state: ServerState) -> ServingRouter:
    if state.router is None:
        raise APIError(503, "the server is starting; try again when /health says ok", "server_error")
    return state.router


def has_key(state: ServerState, request: Request) -> bool:
    return state.api_key is None or key_matches(state.api_key, request.headers.get("authorization", ""))


def authorize(state: ServerState, request: Request) -> None:
    if not has_key(state, request):
        raise APIError(401, "incorrect or missing API key (send 'Authorization: Bearer <key>')",
                       "authentication_error", code="invalid_api_key")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with a 413 as soon as it is known to exceed ``limit`` bytes: from its
    Content-Length before reading any of it, else while it streams in."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > len(str(limit)) or int(declared) > limit):
        raise too_large(limit)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def refused(reason: str, retry_after: float | None = None) -> JSONResponse:
    """429 before any work: OpenAI's rate-limit error saying why, when to retry (whole seconds,
    at least one: the predicted backlog where the admission stage knows it) and the reason header."""
    seconds = max(1, math.ceil(retry_after or 0.0))
    return JSONResponse(APIError(429, reason, "rate_limit_exceeded", code="rejected").body(), status_code=429,
                        headers={"Retry-After": str(seconds), "x-tropical-reason": reason})


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than this server's limit of {limit / MIB:g} MiB "
                         f"(--max-body-mb)", code="request_too_large")


async def generate(state: ServerState, request: Request,
                   parse: Callable[[bytes, dict], GenerationRequest]) -> Response:
    authorize(state, request)
    router = ready(state)
    body = await read_body(request, state.max_body_bytes)
    gen = await asyncio.to_thread(parse, body, dict(request.headers))
    if gen.model != state.model_id:
        raise APIError(404, f"model {shown(gen.model)} does not exist; this server serves "
                            f"{shown(state.model_id)}", "not_found_error", param="model",
                       code="model_not_found")
    submission = await asyncio.to_thread(prepare, gen, router.tokenizer, state)
    try:
        handle = router.submit(choice_submission(submission, 0))
    except Rejected as exc:
        return rejected(exc)
    reply = Reply([handle], gen, state.model_id, f"{'chatcmpl' if gen.chat else 'cmpl'}-{uuid.uuid4().hex}",
                  router.tokenizer, router.abort)
    try:
        got = await reply.next_event(request)
    except BaseException:
        reply.abort_all()
        raise
    if got is None:
        return Response(status_code=499)
    first = got[1]
    if first.error is not None and first.status == 429:
        return refused(first.error)
    if first.error is not None:
        raise APIError(first.status, first.error, "server_error")
    reply.hold(got)
    refusal = more_choices(router, reply, submission, gen.sampling.n)
    if refusal is not None:
        return refusal
    if gen.stream:
        return StreamingResponse(reply.stream(request), media_type="text/event-stream",
                                 headers=reply.headers())
    return await reply.whole(request)


def prepare(gen: GenerationRequest, tokenizer: Tokenizer, state: ServerState) -> Submission:
    """The router's submission for ``gen``, its response format compiled (a 400 before any work)."""
    submission = to_submission(gen, tokenizer, state.limits)
    fmt = gen.sampling.response_format
    if fmt is None:
        return submission
    from tropical.serve.structured import compile_format  # llguidance loads only for formats

    return replace(submission, constraint=compile_format(fmt, tokenizer))


def choice_submission(submission: Submission, index: int) -> Submission:
    """Choice ``index`` of a request: a seeded request's choices draw from seeds seed, seed+1, ...
    so that each is reproducible and they differ."""
    seed = submission.params.seed
    if index == 0 or seed is None:
        return submission
    return replace(submission, params=replace(submission.params, seed=(seed + index) % 2**63))


def more_choices(router: ServingRouter, reply: Reply, submission: Submission, n: int) -> Response | None:
    """Submit choices 1..n-1 once choice 0 has its first token: its prompt's KV is then in the
    prefix cache, so the others reuse it instead of computing it again. A refusal refuses all."""
    for index in range(1, n):
        try:
            reply.follow(router.submit(choice_submission(submission, index)))
        except Rejected as exc:
            reply.abort_all()
            return rejected(exc)
    return None


def rejected(exc: Rejected) -> Response:
    if exc.status == 429:
        return refused(exc.reason, exc.retry_after)
    kind = "invalid_request_error" if exc.status == 400 else "server_error"
    raise APIError(exc.status, exc.reason, kind) from exc
