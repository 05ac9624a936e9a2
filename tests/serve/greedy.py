"""What the live-server tests send and expect: prompts, the engine's own greedy answers to them,
and a client that sends them all at once."""

from __future__ import annotations

import asyncio

import httpx

from tropical.engine.generate import generate
from tropical.engine.loader import load_model

PROMPTS = ["the quick brown fox", "a b c d e f g h i j k", "serving systems", "tropical fish " * 6]
MAX_TOKENS = 12


def greedy_reference() -> list[str]:
    """Each prompt's greedy continuation by the engine alone, no server involved."""
    loaded = load_model("tiny-random")
    return [generate(loaded, p, MAX_TOKENS, chat=False).text for p in PROMPTS]


async def complete_all(url: str) -> tuple[list[str], list[str]]:
    """All prompts at once (so they batch together); texts and the path each took."""
    async with httpx.AsyncClient(timeout=60) as client:
        replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
            "model": "tiny-random", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}) for p in PROMPTS))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json()["choices"][0]["text"] for r in replies], [r.headers["x-tropical-path"] for r in replies]
