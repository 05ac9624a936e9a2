"""One streamed completion over HTTP, timed chunk by chunk; every failure ends in ``error``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable

import httpx

from tropical.bench.record import Measurement

Clock = Callable[[], float]
LINE_END = re.compile(r"\r\n|\r|\n")
# Tropical's response headers: which path the prefill took, on which worker, and the policy's reason
# (others send none).
PATH_HEADER = "x-tropical-path"
PREFILL_WORKER_HEADER = "x-tropical-prefill-worker"
REASON_HEADER = "x-tropical-reason"


async def measure(client: httpx.AsyncClient, body: dict, m: Measurement, clock: Clock,
                  timeout: float) -> Measurement:
    """Send ``body`` to /v1/completions and fill ``m``; never raises, never outlives ``timeout``."""
    m.sent = clock()
    try:
        await asyncio.wait_for(_stream(client, body, m, clock), timeout)
    except asyncio.TimeoutError:
        m.error = f"timed out after {timeout:g} s"
    except httpx.HTTPError as err:
        m.error = f"{type(err).__name__}: {err}"
    m.close(clock())
    return m


async def _stream(client: httpx.AsyncClient, body: dict, m: Measurement, clock: Clock) -> None:
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code >= 400:
            detail = (await resp.aread()).decode(errors="replace")
            m.error = f"HTTP {resp.status_code}: {detail[:200]}"
            return
        m.path, m.prefill_worker = resp.headers.get(PATH_HEADER), resp.headers.get(PREFILL_WORKER_HEADER)
        m.reason = resp.headers.get(REASON_HEADER)
        async for line in sse_lines(resp):
            data = line.removeprefix("data:").strip() if line.startswith("data:") else None
            if data == "[DONE]":
                m.saw_done = True
                return
            if data and not _record(m, data, clock()):
                return


async def sse_lines(resp: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines as SSE ends them (CR, LF or CRLF). httpx's ``aiter_lines`` also splits at
    U+2028, U+0085 and the like, which servers that send JSON as raw UTF-8 (vLLM) put in token text."""
    pending = ""
    async for text in resp.aiter_text():
        *lines, pending = LINE_END.split(pending + text)
        for line in lines:
            yield line
    if pending:
        yield pending


def _record(m: Measurement, data: str, now: float) -> bool:
    """Note one SSE event in ``m``; False when it reports an error and the stream is over for us."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        m.error = f"malformed stream event: {data[:100]}"
        return False
    if "error" in event:
        m.error = f"server error: {json.dumps(event['error'])[:200]}"
        return False
    choices = event.get("choices") or []
    # Every chunk with a choice carries tokens (an empty-text one too: the last may carry only a
    # finish reason after tokens that made no text), unless the server says it carries none.
    # The usage-only chunk has no choice.
    tokens = choices[0].get("tokens") if choices else None
    if choices and tokens != 0:
        m.add_chunk(now, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None)
    usage = event.get("usage") or {}
    if usage.get("completion_tokens") is not None:
        m.usage_tokens = usage["completion_tokens"]
    if usage.get("prompt_tokens") is not None:
        m.usage_prompt_tokens = usage["prompt_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        m.cached_tokens = cached
    return True
