"""One vLLM OpenAI server as a worker of the router: its HTTP calls, and whether it is alive.

The router talks to an instance only through ``/v1/completions`` with prompt token ids (so the
router's tokenizer decides the prompt exactly) and ``return_token_ids`` (so the router's own
detokenizer and stop strings apply, as with our engine). Streams ask for vLLM's usage chunk, whose
``prompt_tokens_details.cached_tokens`` (on with ``--enable-prompt-tokens-details``) says how
much of the prompt the instance's prefix cache held. A connection that fails marks the
instance dead; ``probe`` lets a watcher notice deaths between requests too. ``restart`` brings a
dead one back: a started instance as a new process with the same launch (role, port, cores), an
attached one once its URL answers again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tropical.serve.vllm.process import VllmProcess

CONNECT_ERRORS = (httpx.TransportError,)
PROBE_TIMEOUT_S = 10.0
READY_POLL_S = 1.0


class InstanceDied(Exception):
    """The instance stopped answering (connection refused, reset or cut mid-stream)."""


class InstanceError(Exception):
    """The instance answered with an error status; ``status`` and its message are kept."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"vLLM answered {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Chunk:
    """New token ids of one streamed choice, and its finish reason once it ends; or, from the
    usage chunk after the last one, the prompt tokens the instance found cached."""

    token_ids: list[int]
    finish_reason: str | None = None
    cached_tokens: int | None = None


@dataclass(eq=False)
class VllmInstance:
    """A started (``process``) or attached vLLM server at ``url``; ``on_death`` is called once."""

    url: str
    model: str
    process: VllmProcess | None = None
    alive: bool = True
    on_death: Callable[[], None] | None = None
    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=None))

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def node(self) -> str:
        return self.url

    def died(self) -> None:
        """Mark the instance dead (once) and tell the router; ``restart`` ends what is left of it."""
        if self.alive:
            self.alive = False
            if self.on_death is not None:
                self.on_death()

    async def restart(self, timeout: float) -> None:
        """Bring a dead instance back and wait until it answers: a started one's whole process group
        is stopped (its engine-core child may outlive its server) and the same launch started
        again; an attached one is waited for. Raises as ``wait_ready`` does."""
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)
            self.process = VllmProcess.start(self.process.launch)
        await self.wait_ready(timeout)
        self.alive = True

    async def wait_ready(self, timeout: float) -> None:
        """Until /v1/models answers; fails early (with its log's tail) if its process exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.process is not None and not self.process.running:
                raise RuntimeError(f"vLLM at {self.url} exited while starting; the end of "
                                   f"{self.process.launch.log}:\n{self.process.tail()}")
            try:
                if (await self.client.get(f"{self.url}/v1/models", timeout=5)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(READY_POLL_S)
        raise TimeoutError(f"vLLM at {self.url} was not ready within {timeout:.0f}s")

    async def probe(self) -> bool:
        """False, and the instance marked dead, once its process has exited or nothing listens on
        its port any more; a slow or failing /health (a busy machine) is not a death."""
        if self.process is not None and not self.process.running:
            self.died()
            return False
        try:
            await self.client.get(f"{self.url}/health", timeout=PROBE_TIMEOUT_S)
        except httpx.ConnectError:
            self.died()
            return False
        except httpx.TransportError:
            pass
        return True

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A whole (non-streamed) completion's JSON."""
        try:
            response = await self.client.post(f"{self.url}/v1/completions", json=self._body(body, False))
        except CONNECT_ERRORS as exc:
            self.died()
            raise InstanceDied(f"vLLM at {self.url} stopped answering: {exc!r}") from exc
        _raise_for(response.status_code, response.text)
        return response.json()

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        """The streamed tokens; closing the iterator closes the connection, which aborts the
        request inside vLLM and frees its KV there."""
        try:
            async with self.client.stream("POST", f"{self.url}/v1/completions",
                                          json=self._body(body, True)) as response:
                if response.status_code != 200:
                    _raise_for(response.status_code, (await response.aread()).decode(errors="replace"))
                async for line in _lines(response):
                    chunk = _chunk(line)
                    if chunk is not None:
                        yield chunk
        except CONNECT_ERRORS as exc:
            self.died()
            raise InstanceDied(f"vLLM at {self.url} stopped answering: {exc!r}") from exc

    def _body(self, body: dict[str, Any], stream: bool) -> dict[str, Any]:
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        return {**body, **usage, "model": self.model, "stream": stream, "return_token_ids": True}

    async def close(self) -> None:
        await self.client.aclose()


async def _lines(response: httpx.Response) -> AsyncIterator[str]:
    """SSE lines split only at CR/LF: token text may hold U+2028, where str.splitlines would break."""
    pending = b""
    async for data in response.aiter_bytes():
        pending += data
        *lines, pending = pending.replace(b"\r\n", b"\n").split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def cached_tokens(reply: dict[str, Any]) -> int | None:
    """The prompt tokens a reply's usage says the instance's prefix cache held (None when it
    does not say: an instance started without ``--enable-prompt-tokens-details``)."""
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return cached if isinstance(cached, int) else None


def _chunk(line: str) -> Chunk | None:
    """The tokens of one ``data:`` line, or the usage chunk's cached tokens; None for blank
    lines, usage without them and [DONE]."""
    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
        return None
    event = json.loads(line[5:])
    if "error" in event:
        raise InstanceError(500, str(event["error"].get("message", event["error"])))
    choices = event.get("choices") or []
    if not choices:
        cached = cached_tokens(event)
        return None if cached is None else Chunk([], None, cached)
    choice = choices[0]
    return Chunk(list(choice.get("token_ids") or []), choice.get("finish_reason"))


def _raise_for(status: int, text: str) -> None:
    if status == 200:
        return
    try:
        message = json.loads(text).get("error", {}).get("message", text)
    except (ValueError, AttributeError):
        message = text
    raise InstanceError(status, str(message)[:500])
