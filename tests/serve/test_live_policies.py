"""Every policy serves the same greedy tokens, migrations included, as the engine alone does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.live_server import live_server
from tests.serve.greedy import PROMPTS, complete_all


@pytest.mark.parametrize("policy", ["colocated", "chunked", "disagg", "tropical", "tropical+"])
def test_policy_serves_the_engines_greedy_tokens(tmp_path: Path, reference: list[str], policy: str) -> None:
    args = ["--policy", policy, "--max-batched-tokens", "8"] if policy == "chunked" else ["--policy", policy]
    with live_server(tmp_path, *args) as server:
        texts, paths = asyncio.run(complete_all(server.url))
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert texts == reference
    if policy == "disagg":
        assert set(paths) == {"prefill"}
        assert f"tropical_migrations_total {float(len(PROMPTS))}" in metrics
    if policy == "colocated":
        assert set(paths) == {"colocated"}
