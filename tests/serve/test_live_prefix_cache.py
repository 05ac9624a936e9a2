"""Prefix caching live (tiny-random, tropical policy): a repeated prompt reuses its KV, the text
never changes, usage and /metrics say how many prompt tokens were cached, and --prefix-cache off
caches nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, live_server

PROMPT = [(7 * i) % 90 + 3 for i in range(120)]
CHAT = [{"role": "user", "content": " ".join(f"line {i} of the shared preamble." for i in range(20))}]


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("prefix-on")
    with live_server(tmp, "--max-model-len", "512", "--iteration-log", str(tmp / "iterations.jsonl")) as s:
        yield s


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("prefix-off"), "--max-model-len", "512",
                     "--prefix-cache", "off") as s:
        yield s


def _ask(server: LiveServer, chat: bool, stream: bool, prompt: list[int] | None = None) -> tuple[str, dict]:
    """The text and usage of one greedy request (a stream asks for its usage chunk)."""
    body: dict = {"model": "tiny-random", "max_tokens": 8, "temperature": 0, "stream": stream}
    body.update({"messages": CHAT} if chat else {"prompt": PROMPT if prompt is None else prompt})
    if stream:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    if not stream:
        data = reply.json()
        choice = data["choices"][0]
        return (choice["message"]["content"] if chat else choice["text"]), data["usage"]
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    pieces = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join((p["delta"].get("content") or "") if chat else p["text"] for p in pieces)
    return text, chunks[-1]["usage"]


def _cached_tokens(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_repeated_prompt_hits_and_says_the_same_with_and_without_the_cache(
        cached: LiveServer, uncached: LiveServer, chat: bool) -> None:
    first, usage = _ask(cached, chat, stream=False)
    replies = [_ask(cached, chat, stream) for stream in (False, True)]
    plain = [_ask(uncached, chat, stream) for stream in (False, True, False)]
    assert [text for text, _ in replies] == [first, first] == [text for text, _ in plain][:2]
    prompt = usage["prompt_tokens"]
    assert all(0 < _cached_tokens(u) < prompt and _cached_tokens(u) % 16 == 0 for _, u in replies)
    assert _cached_tokens(replies[0][1]) == (prompt - 1) // 16 * 16
    assert all(_cached_tokens(u) == 0 for _, u in plain)


def test_a_prompt_differing_in_its_first_token_hits_nothing(cached: LiveServer) -> None:
    _ask(cached, False, stream=False)
    _, usage = _ask(cached, False, stream=False, prompt=[PROMPT[0] + 1, *PROMPT[1:]])
    assert _cached_tokens(usage) == 0


def test_a_one_token_prompt_caches_nothing_and_works(cached: LiveServer) -> None:
    answers = [_ask(cached, False, stream=False, prompt=[11]) for _ in range(2)]
    assert answers[0][0] == answers[1][0] and [_cached_tokens(u) for _, u in answers] == [0, 0]


def test_cached_tokens_are_the_prompt_tokens_not_computed_and_the_metrics_count_them(cached: LiveServer
                                                                                      ) -> None:
    before = _prefix_metrics(cached)
    log = Path(cached.log).parent / "iterations.jsonl"
    computed_before = _prefill_tokens(log)
    usages = [_ask(cached, False, stream=False, prompt=PROMPT[:90] + [5] * i)[1] for i in range(1, 4)]
    after = _prefix_metrics(cached)
    prompts = sum(u["prompt_tokens"] for u in usages)
    hits = sum(_cached_tokens(u) for u in usages)
    assert hits > 0
    assert after["hits"] - before["hits"] == hits and after["queries"] - before["queries"] == prompts
    assert _prefill_tokens(log) - computed_before == prompts - hits


def _prefix_metrics(server: LiveServer) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    totals = {"queries": 0.0, "hits": 0.0}
    for family in text_string_to_metric_families(text):
        for kind in totals:
            if family.name == f"tropical_prefix_cache_{kind}":
                totals[kind] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def _prefill_tokens(log: Path) -> int:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return sum(line["shape"]["prefill_tokens"] for line in lines if "shape" in line)



def test_a_migration_moves_only_the_tokens_its_decode_worker_lacks(cached: LiveServer) -> None:
    _ask(cached, False, stream=False)
    before = _counter(cached, "tropical_migrated_tokens_total")
    _, usage = _ask(cached, False, stream=False)
    prompt = usage["prompt_tokens"]
    assert prompt % 16 and _counter(cached, "tropical_migrated_tokens_total") - before == prompt % 16


def _counter(server: LiveServer, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name)
