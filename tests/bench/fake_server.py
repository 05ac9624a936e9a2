"""A scripted OpenAI-compatible server for bench tests: tokens stream at known times.

Each completion waits ``first_delay`` then sends one token chunk every ``gap`` seconds, so the
client's TTFT, TPOT and inter-token latency are known in advance. Or it plays ``chunks`` as
scripted (delay, tokens, text) steps: several tokens in one chunk, chunks with empty text, and
the token count in each choice when ``state_tokens``. Its usage counts ``prompt_tokens`` and, when
set, ``cached_tokens`` of them found in a prefix cache. It can also fail on purpose.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODEL = "fake-model"


@dataclass
class Script:
    """How the fake server answers; ``received`` collects the request bodies it got."""

    first_delay: float = 0.05
    gap: float = 0.02
    status: int = 200
    hang_after: int | None = None
    send_done: bool = True
    send_usage: bool = True
    prompt_tokens: int = 1
    cached_tokens: int | None = None
    max_model_len: int | None = 4096
    token_text: str = " t{i}"
    chunks: tuple[tuple[float, int, str], ...] | None = None
    state_tokens: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    received: list[dict] = field(default_factory=list)

    def steps(self, count: int) -> list[tuple[float, int, str]]:
        """(delay before, tokens, text) of each chunk: the scripted ones, else one token per gap."""
        if self.chunks is not None:
            return list(self.chunks)
        delays = [self.first_delay] + [self.gap] * (count - 1)
        return [(delay, 1, self.token_text.format(i=i)) for i, delay in enumerate(delays)]


def _event(payload: dict | str) -> str:
    """JSON as raw UTF-8, as vLLM sends it: a U+2028 in a token's text stays one character."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def _tokens(script: Script, count: int) -> AsyncIterator[str]:
    steps = script.steps(count)
    for i, (delay, tokens, text) in enumerate(steps):
        if i == script.hang_after:
            await asyncio.sleep(3600)
        await asyncio.sleep(delay)
        finish = "length" if i == len(steps) - 1 else None
        choice = {"index": 0, "text": text, "finish_reason": finish}
        if script.state_tokens:
            choice["tokens"] = tokens
        yield _event({"object": "text_completion", "model": MODEL, "choices": [choice]})
    if script.send_usage:
        usage: dict = {"prompt_tokens": script.prompt_tokens,
                       "completion_tokens": sum(tokens for _, tokens, _ in steps)}
        if script.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": script.cached_tokens}
        yield _event({"choices": [], "usage": usage})
    if script.send_done:
        yield _event("[DONE]")


def fake_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": MODEL, "object": "model", "max_model_len": script.max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        if script.status != 200:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=script.status)
        return StreamingResponse(_tokens(script, body["max_tokens"]), media_type="text/event-stream",
                                 headers=script.headers)

    return app


@contextmanager
def serving(script: Script) -> Iterator[str]:
    """The fake server on a free local port in a background thread; yields its base URL."""
    config = uvicorn.Config(fake_app(script), host="127.0.0.1", port=0, log_level="error",
                            lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "fake server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
