"""Every policy serves the same greedy tokens, migrations included, as the engine alone does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.live_server import live_server
from tropical.engine.generate import generate
from tropical.engine.loader import load_model

PROMPTS = ["the quick brown fox", "a b c d e f g h i j k", "serving systems", "tropical fish " * 6]
MAX_TOKENS = 12


async def _complete_all(url: str) -> tuple[list[str], list[str]]:
    """All prompts at once (so they batch together); texts and the path each took."""
    async with httpx.AsyncClient(timeout=60) as client:
        replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
            "model": "tiny-random", "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}) for p in PROMPTS))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json()["choices"][0]["text"] for r in replies], [r.headers["x-tropical-path"] for r in replies]


@pytest.fixture(scope="module")
def reference() -> list[str]:
    loaded = load_model("tiny-random")
    return [generate(loaded, p, MAX_TOKENS, chat=False).text for p in PROMPTS]


@pytest.mark.parametrize("policy", ["colocated", "chunked", "disagg", "tropical", "tropical+"])
def test_policy_serves_the_engines_greedy_tokens(tmp_path: Path, reference: list[str], policy: str) -> None:
    args = ["--policy", policy, "--max-batched-tokens", "8"] if policy == "chunked" else ["--policy", policy]
    with live_server(tmp_path, *args) as server:
        texts, paths = asyncio.run(_complete_all(server.url))
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert texts == reference
    if policy == "disagg":
        assert set(paths) == {"prefill"}
        assert f"tropical_migrations_total {float(len(PROMPTS))}" in metrics
    if policy == "colocated":
        assert set(paths) == {"colocated"}
