"""vLLM instances' prefix caches seen by the router (issue 37, part 4), against fake instances that
cache prefixes as vLLM does and report ``cached_tokens``: the mirror of the instance that computed
a prompt holds its blocks, a cache-aware policy sends a repeat there, and the client's usage and
the instance's metrics carry the hit the instance reported."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.live_server import eventually
from tests.serve.vllm.fake_vllm import FakeVllm, RunningFake, running_fake
from tests.serve.vllm.test_driver import MODEL, profile, sample, serving  # noqa: F401 (a fixture)
from tropical.engine.block_hash import block_hashes
from tropical.engine.loader import load_model
from tropical.serve.options import ServeOptions
from tropical.serve.process import free_port
from tropical.serve.server import server_state

PROMPT = "a conversation that goes on and on about the weather " * 6
BLOCK = 16


@pytest.fixture
def fakes() -> Iterator[list[RunningFake]]:
    with ExitStack() as stack:
        yield [stack.enter_context(running_fake(FakeVllm(MODEL, step_s=0.002, block_size=BLOCK)))
               for _ in range(2)]


def complete(url: str, prompt: str, max_tokens: int = 4, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body})


def served_by(fakes: list[RunningFake], prompt_ids: list[int]) -> list[int]:
    """Which fakes got ``prompt_ids``, in order of the fakes."""
    return [i for i, f in enumerate(fakes) for r in f.fake.requests if r["prompt"] == prompt_ids]


@pytest.mark.parametrize("stream", [False, True])
def test_a_repeat_goes_to_the_instance_whose_cache_the_mirror_saw_fill(
        fakes: list[RunningFake], profile: Path, tmp_path: Path, stream: bool) -> None:  # noqa: F811
    urls = ",".join(f"colocated={f.url}" for f in fakes)
    options = ServeOptions(model=MODEL, engine="vllm", policy="kv-router", worker_urls=urls,
                           profile=str(profile), port=free_port(), vllm_out=str(tmp_path))
    state = server_state(options)
    prompt_ids = load_model(MODEL).tokenizer.encode(PROMPT)
    hit = (len(prompt_ids) - 1) // BLOCK * BLOCK
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    with serving(options, state) as url:
        # A long request on instance 0 (both idle: the lowest id) sends the prompt to instance 1.
        busy = threading.Thread(target=complete, args=(url, "something else entirely", 300))
        busy.start()
        assert eventually(lambda: len(fakes[0].fake.requests) == 1), "the long request never started"
        first = complete(url, PROMPT)
        busy.join()
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        mirror = state.router.workers[1].kv.cache
        assert set(block_hashes(prompt_ids, BLOCK)) <= set(mirror.entries), "the mirror missed the blocks"
        # Both idle again: only the cache tells instance 1 from instance 0 now.
        again = complete(url, PROMPT, **extra)
        text = httpx.get(f"{url}/metrics").text
    assert served_by(fakes, prompt_ids) == [1, 1]
    assert again.status_code == 200, again.text
    usage = again.json()["usage"] if not stream else usage_of(again)
    assert usage["prompt_tokens_details"]["cached_tokens"] == hit > 0
    assert sample(text, "tropical_prefix_cache_hits_total", worker="1") == hit
    assert sample(text, "tropical_prefix_cache_queries_total", worker="1") == 2 * len(prompt_ids)


def usage_of(stream: httpx.Response) -> dict:
    lines = [line[6:] for line in stream.text.splitlines() if line.startswith("data: {")]
    return next(json.loads(line)["usage"] for line in reversed(lines) if '"usage"' in line)


def test_with_the_prefix_cache_off_no_request_carries_a_prefix(
        fakes: list[RunningFake], profile: Path, tmp_path: Path) -> None:  # noqa: F811
    for running in fakes:
        running.fake.prefix_cache = False
    urls = ",".join(f"colocated={f.url}" for f in fakes)
    options = ServeOptions(model=MODEL, engine="vllm", policy="kv-router", worker_urls=urls,
                           profile=str(profile), port=free_port(), vllm_out=str(tmp_path), prefix_cache=False)
    state = server_state(options)
    with serving(options, state) as url:
        replies = [complete(url, PROMPT) for _ in range(2)]
    assert [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies] == [0, 0]
    assert all(w.kv.cache is None for w in state.router.workers)
