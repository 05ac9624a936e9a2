"""`tropical profile --server URL`: a latency profile of a running vLLM (or any OpenAI-compatible)
server, measured over HTTP, fitted into the same FittedModel the simulator and the toggle read.

Prefill points time a whole completion of ``max_tokens: 1`` by prompt length (what Path 1 waits
for, HTTP included). Decode points start ``batch`` streams of a ``context``-token prompt at once
and take the median gap between tokens once every stream has its first token (the server's
decode iteration at that batch and context). Prompts differ in their first token, so no prefix
cache hit shortens a prefill. KV transfer is not measured here: the router times each hand-off
as it happens (``tropical_migration_seconds``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from tropical.core.latency.shape import BatchShape
from tropical.engine.profiler import ProfileResult, Sample, fit_samples
from tropical.serve.vllm.instance import VllmInstance

UNMEASURED_BANDWIDTH = 1e12
"""Bytes/s standing in for the link: never measured here, so it prices hand-offs at ~0 and the
router's online view (measured hand-offs) is what counts."""


@dataclass(frozen=True, slots=True)
class HttpGrid:
    """Prompt lengths to prefill; (batch, context) pairs to decode over ``decode_tokens`` steps."""

    prefill_new: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    decode_tokens: int
    repeats: int


HTTP_GRIDS = {
    "quick": HttpGrid((32, 128, 512), (1, 4), (64, 512), decode_tokens=8, repeats=3),
    "medium": HttpGrid((32, 128, 512, 1024, 1536), (1, 4, 8), (64, 512, 1024), decode_tokens=12, repeats=3),
    "full": HttpGrid((32, 128, 512, 1024, 1536, 1900), (1, 4, 8, 16), (64, 512, 1024, 1536),
                     decode_tokens=16, repeats=5),
}


class ServerProfiler:
    """Measures one server; ``vocab_low`` keeps synthetic token ids clear of special tokens."""

    def __init__(self, instance: VllmInstance, vocab_low: int = 100) -> None:
        self.instance = instance
        self.vocab_low = vocab_low
        self._first = count(vocab_low)

    def _prompt(self, length: int) -> list[int]:
        """A prompt no earlier one shares a prefix with."""
        return [next(self._first), *(self.vocab_low + i % 97 for i in range(length - 1))]

    async def prefill_seconds(self, length: int, repeats: int) -> float:
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            await self.instance.complete({"prompt": self._prompt(length), "max_tokens": 1, "temperature": 0})
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    async def decode_seconds(self, batch: int, context: int, tokens: int) -> float:
        stamps = await asyncio.gather(*(self._token_times(context, tokens) for _ in range(batch)))
        all_started = max(s[0][0] for s in stamps)
        gaps: list[float] = []
        for chunks in stamps:
            for (a, _), (b, carried) in zip(chunks, chunks[1:], strict=False):
                if a >= all_started:
                    gaps += [(b - a) / carried] * carried
        if not gaps:
            raise RuntimeError(f"the server streamed too few tokens to time a decode at batch {batch}")
        return statistics.median(gaps)

    async def _token_times(self, context: int, tokens: int) -> list[tuple[float, int]]:
        """When each streamed chunk came and how many tokens it carried: a server may send the
        tokens of several iterations in one chunk, each of which is one decode iteration."""
        body = {"prompt": self._prompt(context), "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        return [(time.perf_counter(), len(chunk.token_ids)) async for chunk in self.instance.stream(body)
                if chunk.token_ids]


async def profile_server(instance: VllmInstance, grid: HttpGrid, kv_bytes_per_token: float) -> ProfileResult:
    """Measure every point of ``grid`` on ``instance`` (one at a time) and fit them."""
    profiler = ServerProfiler(instance)
    samples = [Sample("prefill", BatchShape.prefill(n), await profiler.prefill_seconds(n, grid.repeats))
               for n in grid.prefill_new]
    for batch in grid.decode_batch:
        for context in grid.decode_context:
            seconds = statistics.median([await profiler.decode_seconds(batch, context, grid.decode_tokens)
                                         for _ in range(grid.repeats)])
            mean_context = context + grid.decode_tokens // 2
            samples.append(Sample("decode", BatchShape.decode(batch, batch * mean_context), seconds))
    return fit_samples(samples, kv_bytes_per_token, UNMEASURED_BANDWIDTH, 0.0)


def kv_bytes_per_token(config: dict, dtype: str) -> float:
    """K and V of every layer for one token, from a Hugging Face config.json."""
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return float(2 * config["num_hidden_layers"] * heads * head_dim * (4 if dtype == "float32" else 2))


async def measure_server(url: str, grid: str, model_dir: str | None, dtype: str) -> ProfileResult:
    """Profile the server at ``url`` (its first model); KV bytes per token come from the model's
    config.json: the directory the server names as its model's root, else ``model_dir``."""
    instance = VllmInstance(url.rstrip("/"), "")
    try:
        models = (await instance.client.get(f"{instance.url}/v1/models", timeout=30)).json()["data"]
        instance.model = models[0]["id"]
        config = _config(models[0].get("root"), model_dir)
        kv_bytes = kv_bytes_per_token(config, dtype) if config else 0.0
        return await profile_server(instance, HTTP_GRIDS[grid], kv_bytes)
    finally:
        await instance.close()


def _config(*dirs: str | None) -> dict | None:
    for folder in dirs:
        if folder and (Path(folder) / "config.json").is_file():
            return json.loads((Path(folder) / "config.json").read_text())
    return None
