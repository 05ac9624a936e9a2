"""Every policy serves the same greedy tokens, migrations included, as the engine alone does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.live_server import live_server
from tests.serve.greedy import PROMPTS, complete_all

# chunked: a budget of 4 tokens splits every prompt longer than that; tropical: a 1 µs TTFT SLO
# puts every request at risk on the prefill worker, even alone there (the tiny model's profile
# prices these prompts under 1 ms), so the toggle must look for Path 2 for each: it multiplexes
# those that queue behind another and falls back otherwise. tropical+ multiplexes only prompts
# it can still serve in time, never at 1 µs: its Path 2 on the live server is tested in
# test_live_chunked_multiplex.py.
FLAGS = {"chunked": ["--chunk-budget", "4"], "tropical": ["--slo-ttft-ms", "0.001"]}


@pytest.mark.parametrize("policy", ["colocated", "chunked", "disagg", "tropical", "tropical+"])
def test_policy_serves_the_engines_greedy_tokens(tmp_path: Path, reference: list[str], policy: str) -> None:
    with live_server(tmp_path, "--policy", policy, *FLAGS.get(policy, [])) as server:
        texts, paths = asyncio.run(complete_all(server.url))
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert texts == reference
    if policy == "disagg":
        assert set(paths) == {"prefill"}
        assert f"tropical_migrations_total {float(len(PROMPTS))}" in metrics
    if policy == "colocated":
        assert set(paths) == {"colocated"}
    if policy == "chunked":
        assert _counter(metrics, "tropical_prefill_chunks_total") > 0, "no prompt was chunked"
    if policy == "tropical":
        assert set(paths) <= {"multiplex", "fallback"}, paths


def _counter(metrics: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + " "))
