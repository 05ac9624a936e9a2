"""A scripted OpenAI-compatible server for bench tests: tokens stream at known times.

Each completion waits ``first_delay`` then sends one token chunk every ``gap`` seconds, so the
client's TTFT, TPOT and inter-token latency are known in advance. It can also fail on purpose.
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
    max_model_len: int | None = 4096
    token_text: str = " t{i}"
    received: list[dict] = field(default_factory=list)


def _event(payload: dict | str) -> str:
    """JSON as raw UTF-8, as vLLM sends it: a U+2028 in a token's text stays one character."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def _tokens(script: Script, count: int) -> AsyncIterator[str]:
    await asyncio.sleep(script.first_delay)
    for i in range(count):
        if i == script.hang_after:
            await asyncio.sleep(3600)
        if i:
            await asyncio.sleep(script.gap)
        finish = "length" if i == count - 1 else None
        choice = {"index": 0, "text": script.token_text.format(i=i), "finish_reason": finish}
        yield _event({"object": "text_completion", "model": MODEL, "choices": [choice]})
    if script.send_usage:
        yield _event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": count}})
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
        return StreamingResponse(_tokens(script, body["max_tokens"]), media_type="text/event-stream")

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
