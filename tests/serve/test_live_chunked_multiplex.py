"""`tropical+` on the live server: a long prompt is prefilled in chunks by the multiplexing
worker while other requests decode there, and every answer equals the engine's lone greedy run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import live_server
from tropical.engine.generate import generate
from tropical.engine.loader import load_model

BUDGET = 16
DECODERS = ["serving systems", "the quick brown fox"]
BLOCKERS = [f"{i} a b c d e f g h i j k l m n o p " * 40 for i in range(80)]
"""80: with 60, a host whose cached profile is fast priced their queue at 0.48 s, inside the long
prompt's 500 ms, and it stayed on the prefill worker. (With 120, their decisions did not all come
within the scenario's 60 s wait on this 2-core host.)"""
LONG = "tropical fish swim in warm seas " * 9
RELAXED = {"slo_ttft_ms": 600_000, "slo_tpot_ms": 60_000}


def _body(prompt: str, max_tokens: int, **slo: float) -> dict:
    return {"model": "tiny-random", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **slo}


async def _scenario(url: str) -> tuple[list[httpx.Response], httpx.Response]:
    """Decoders settle on the multiplexing worker, blockers fill the prefill worker's queue,
    then the long prompt arrives with its TTFT at risk there (500 ms, behind a queue of blockers
    predicted to take seconds) but within reach of a dozen chunked iterations: Path 2 is its way."""
    async with httpx.AsyncClient(timeout=120) as client:
        post = lambda body: client.post(f"{url}/v1/completions", json=body)  # noqa: E731
        decoders = [asyncio.create_task(post(_body(p, 160, **RELAXED))) for p in DECODERS]
        await _until(client, url, "tropical_migrations_total", len(DECODERS))
        blockers = [asyncio.create_task(post(_body(p, 4, **RELAXED))) for p in BLOCKERS]
        await _until(client, url, "tropical_path_decisions_total", len(DECODERS) + len(BLOCKERS))
        long = await post(_body(LONG, 12, slo_ttft_ms=500, slo_tpot_ms=60_000))
        return list(await asyncio.gather(*decoders, *blockers)), long


async def _until(client: httpx.AsyncClient, url: str, counter: str, least: float) -> None:
    """Poll the server's ``counter`` (summed over its labels) until it reaches ``least``: the
    scenario's steps wait on what the server has done, not on the time it may take."""
    deadline = time.monotonic() + 60
    while _count((await client.get(f"{url}/metrics")).text, counter) < least:
        assert time.monotonic() < deadline, f"{counter} stayed under {least}"
        await asyncio.sleep(0.05)


def _count(metrics: str, counter: str) -> float:
    samples = (s for family in text_string_to_metric_families(metrics) for s in family.samples)
    return sum(s.value for s in samples if s.name == counter)


def test_a_long_prompt_is_chunked_on_the_multiplexing_worker_with_the_lone_greedy_tokens(
        tmp_path: Path) -> None:
    model = load_model("tiny-random")
    with live_server(tmp_path, "--policy", "tropical+", "--max-batched-tokens", str(BUDGET)) as server:
        others, long = asyncio.run(_scenario(server.url))
    assert long.status_code == 200, long.text
    assert long.headers["x-tropical-path"] == "multiplex", long.headers.get("x-tropical-reason")
    assert long.json()["usage"]["prompt_tokens"] > 3 * BUDGET          # several chunks at least
    assert long.json()["choices"][0]["text"] == generate(model, LONG, 12, chat=False).text
    for reply, (prompt, tokens) in zip(others, [(p, 160) for p in DECODERS] + [(p, 4) for p in BLOCKERS],
                                       strict=True):
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == generate(model, prompt, tokens, chat=False).text
