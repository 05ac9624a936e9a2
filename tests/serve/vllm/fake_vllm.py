"""A fake vLLM OpenAI server with the HTTP surface the router uses, for tests without vLLM.

``/v1/completions`` takes prompt token ids, streams or not, returns ``token_ids`` (as vLLM does
with ``return_token_ids``) and speaks the P/D protocol: ``kv_transfer_params.do_remote_decode``
makes a prefill that returns one token and hand-off params naming this server; a request carrying
``do_remote_prefill`` params must name a hand-off a fake really made (else 400), and is logged as
pulled. Its greedy answer depends only on the prompt, so every path returns the same tokens.
Its prefix cache, as vLLM's, keeps every full block of the prompts it prefilled (none evicted)
and skips a new prompt's cached run of them, at most all its blocks but the one holding its last
token; every reply's usage says how many tokens that was (``prompt_tokens_details``, in the usage
chunk a stream sends when asked). Timing: ``prefill_s_per_token`` per prompt token not found
cached (recomputed or pulled) and ``step_s`` per token.
``/health``, ``/v1/models`` and ``/metrics`` (with vLLM's cache_config_info) complete the surface.

Run as a module (``python -m tests.serve.vllm.fake_vllm ARGS``) it serves as a process with vLLM's
command line (``--port``, ``--served-model-name``; the rest is ignored), so the router can start,
kill and restart it as it does vLLM (``fake_vllm_python`` writes the stand-in interpreter);
``FAKE_VLLM_STEP_S`` and ``FAKE_VLLM_PREFILL_S`` (per prompt token) set its pace.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from tropical.engine.block_hash import block_hashes
from tropical.serve.process import free_port

HANDOFFS: dict[str, list[int]] = {}
"""Prompts handed off by any fake prefill in this process, by transfer id."""
_transfer_ids = itertools.count()


def answer(prompt: list[int], length: int, vocab: int, eos: int | None) -> list[int]:
    """The fake model's greedy output: a function of the prompt alone, ending in ``eos``."""
    seed = sum(prompt) % 1000
    tokens = [100 + (seed + 37 * i) % (vocab - 200) for i in range(length)]
    return [*tokens[:ANSWER_TOKENS], eos] if eos is not None and length > ANSWER_TOKENS else tokens


ANSWER_TOKENS = 12


@dataclass
class FakeVllm:
    """One fake instance; ``requests`` logs every completion body it got."""

    name: str = "tiny-random"
    vocab: int = 512
    eos: int | None = None
    prefill_s_per_token: float = 0.0005
    step_s: float = 0.005
    blocks: int = 1024
    block_size: int = 16
    known_handoffs: bool = True
    """Refuse a hand-off no fake in this process made (off for a process of its own)."""
    prefix_cache: bool = True
    cached_blocks: set[int] = field(default_factory=set)
    requests: list[dict] = field(default_factory=list)
    pulled: list[dict] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> PlainTextResponse:
            return PlainTextResponse("")

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model"}]})

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(f'vllm:cache_config_info{{block_size="{self.block_size}",'
                                     f'num_gpu_blocks="{self.blocks}"}} 1.0\n')

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            return await self._complete(body)

        return app

    async def _complete(self, body: dict) -> Response:
        prompt, kv = body["prompt"], body.get("kv_transfer_params") or {}
        if body.get("model") != self.name:
            return JSONResponse({"error": {"message": f"model {body.get('model')} not served"}}, 404)
        if kv.get("do_remote_prefill"):
            if self.known_handoffs and HANDOFFS.get(kv.get("transfer_id", "")) != prompt:
                return JSONResponse({"error": {"message": "no such KV hand-off for this prompt"}}, 400)
            self.pulled.append(kv)
        cached = self._look_up(prompt)
        if not kv.get("do_remote_prefill"):
            await asyncio.sleep(self.prefill_s_per_token * (len(prompt) - cached))
        eos = None if body.get("ignore_eos") else self.eos
        tokens = answer(prompt, body["max_tokens"], self.vocab, eos)
        usage = {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": cached}}
        if kv.get("do_remote_decode"):
            return self._prefill_reply(prompt, tokens[:1], usage)
        if body.get("stream"):
            events = self._events(tokens, body["max_tokens"], usage if _wants_usage(body) else None)
            return StreamingResponse(events, media_type="text/event-stream")
        await asyncio.sleep(self.step_s * (len(tokens) - 1))
        return JSONResponse({"choices": [{"index": 0, "text": "", "token_ids": tokens,
                                          "finish_reason": _reason(tokens, body["max_tokens"])}],
                             "usage": usage})

    def _look_up(self, prompt: list[int]) -> int:
        """The prompt's tokens found cached (its blocks are cached from now on)."""
        if not self.prefix_cache:
            return 0
        keys = block_hashes(prompt, self.block_size)
        run = next((i for i, key in enumerate(keys) if key not in self.cached_blocks), len(keys))
        self.cached_blocks.update(keys)
        return min(run * self.block_size, (len(prompt) - 1) // self.block_size * self.block_size)

    def _prefill_reply(self, prompt: list[int], tokens: list[int], usage: dict) -> JSONResponse:
        transfer = f"t{next(_transfer_ids)}"
        HANDOFFS[transfer] = prompt
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.name,
                  "remote_block_ids": [0], "remote_host": "127.0.0.1", "remote_port": 1,
                  "transfer_id": transfer}
        choice = {"index": 0, "text": "", "token_ids": tokens, "finish_reason": "length"}
        return JSONResponse({"choices": [choice], "kv_transfer_params": params, "usage": usage})

    async def _events(self, tokens: list[int], max_tokens: int, usage: dict | None) -> AsyncIterator[bytes]:
        for i, token in enumerate(tokens):
            if i:
                await asyncio.sleep(self.step_s)
            last = i == len(tokens) - 1
            choice = {"index": 0, "text": "", "token_ids": [token],
                      "finish_reason": _reason(tokens, max_tokens) if last else None}
            yield f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
        if usage is not None:
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _wants_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _reason(tokens: list[int], max_tokens: int) -> str:
    return "length" if len(tokens) >= max_tokens else "stop"


@dataclass
class RunningFake:
    """A fake serving on ``url`` in a thread of this process; ``kill`` stops it like a crash."""

    fake: FakeVllm
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def kill(self) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(10)


@contextmanager
def running_fake(fake: FakeVllm) -> Iterator[RunningFake]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    running = RunningFake(fake, f"http://127.0.0.1:{port}", server, thread)
    try:
        yield running
    finally:
        if thread.is_alive():
            running.kill()


def fake_vllm_python(folder: Path) -> Path:
    """A stand-in for vLLM's interpreter: given vLLM's command line, it runs this fake instead."""
    script = folder / "fake-vllm-python"
    root = Path(__file__).resolve().parents[3]
    run = f'exec {sys.executable} -m tests.serve.vllm.fake_vllm "$@"'
    script.write_text(f"#!/bin/sh\nshift 2\ncd {root}\n{run}\n")
    script.chmod(0o755)
    return script


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    args, _ = parser.parse_known_args()
    fake = FakeVllm(args.served_model_name, step_s=float(os.environ.get("FAKE_VLLM_STEP_S", "0.005")),
                    prefill_s_per_token=float(os.environ.get("FAKE_VLLM_PREFILL_S", "0.0005")),
                    known_handoffs=False)
    uvicorn.run(fake.app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
