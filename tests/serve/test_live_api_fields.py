"""The OpenAI fields beyond plain sampling on a live `tropical serve` (tiny-random, tropical policy:
prefill and decode on different workers, so logprobs and constraints cross a migration): logprobs
agree with themselves across paths, n shares its prompt, controls steer greedy decoding."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, live_server
from tropical.engine.loader import load_model
from tropical.engine.tokenizer import Tokenizer

MODEL = "tiny-random"
PROMPT = "The quick brown fox jumps over"
CHAT = [{"role": "user", "content": "Tell me about tropical fish."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("serve"), "--max-model-len", "512") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def post(server: LiveServer, path: str, body: dict) -> dict:
    reply = httpx.post(f"{server.url}/v1{path}", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def token_ids(server: LiveServer, text: str) -> list[int]:
    """The ids of ``text``: echoed with logprobs 0, each token's top entry is itself."""
    body = post(server, "/completions", {"prompt": text, "max_tokens": 1, "echo": True, "logprobs": 0,
                                         "temperature": 0})
    return body["choices"][0]["logprobs"]["tokens"]


def test_greedy_tokens_are_their_positions_most_likely(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = done.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and chosen >= max(top.values()) - 1e-5  # tokens of one text share a key
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-5


def test_echoed_prompt_logprobs_score_what_decoding_scored(server: LiveServer) -> None:
    """The prompt's logprobs of a prompt that holds a greedy completion equal the logprobs that
    completion was decoded with: prefill logits and decode logits agree."""
    first = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 0})
    choice = first["choices"][0]
    echoed = post(server, "/completions", {"prompt": PROMPT + choice["text"], "max_tokens": 1,
                                           "temperature": 0, "echo": True, "logprobs": 0})
    lp = echoed["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    tail = lp["token_logprobs"][-6:-1]  # the last echoed five are the completion's tokens
    if lp["tokens"][-6:-1] == choice["logprobs"]["tokens"]:  # the text re-tokenizes the same way
        assert all(abs(a - b) < 1e-3 for a, b in zip(tail, choice["logprobs"]["token_logprobs"], strict=True))
    assert echoed["choices"][0]["text"].startswith(PROMPT + choice["text"])


def test_streamed_chat_logprobs_equal_the_whole_ones(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=2)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content or []]
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 8
    def rounded(items: list) -> list:
        return [(c.token, round(c.logprob, 5)) for c in items]
    assert rounded(streamed) == rounded(content)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob for c in content)
    ChatCompletion.model_validate(whole.model_dump())
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())


def test_seeded_choices_are_reproducible_and_share_the_prompt(server: LiveServer) -> None:
    body = {"prompt": PROMPT * 8, "max_tokens": 6, "temperature": 1.0, "seed": 11, "n": 3}
    hits_before = cache_hits(server)
    first, again = post(server, "/completions", body), post(server, "/completions", body)
    texts = [c["text"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert texts == [c["text"] for c in again["choices"]] and len(set(texts)) > 1
    assert first["usage"]["completion_tokens"] == 18
    assert cache_hits(server) - hits_before >= 2 * 16  # choices 1 and 2 found choice 0's prompt blocks
    Completion.model_validate(first)


def cache_hits(server: LiveServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "tropical_prefix_cache_hits_total")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_model(MODEL).tokenizer


def ids_of(tokenizer: Tokenizer, text: str) -> list[str]:
    """Every token id whose text alone is ``text`` (as the logprobs name tokens)."""
    return [str(i) for i in range(tokenizer.vocab_size)
            if tokenizer.decode([i], skip_special_tokens=False) == text]


def greedy_first(server: LiveServer) -> str:
    reply = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 0})
    return reply["choices"][0]["logprobs"]["tokens"][0]


def test_logit_bias_steers_greedy_decoding(server: LiveServer, tokenizer: Tokenizer) -> None:
    forced = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                           "logit_bias": {"42": 100}, "logprobs": 0})
    forty_two = tokenizer.decode([42], skip_special_tokens=False)
    assert forced["choices"][0]["logprobs"]["tokens"] == [forty_two] * 4
    first = greedy_first(server)
    banned = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 0,
                                           "logit_bias": {i: -100 for i in ids_of(tokenizer, first)}})
    assert banned["choices"][0]["logprobs"]["tokens"][0] != first


def test_stop_token_ids_end_without_their_text_and_min_tokens_holds_them_off(
        server: LiveServer, tokenizer: Tokenizer) -> None:
    stop = [int(i) for i in ids_of(tokenizer, greedy_first(server))]
    stopped = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                            "stop_token_ids": stop})
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["choices"][0]["text"] == ""
    held = post(server, "/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                         "stop_token_ids": stop, "min_tokens": 3})
    assert held["usage"]["completion_tokens"] >= 3


def test_a_json_schema_constrains_the_output(server: LiveServer, tokenizer: Tokenizer) -> None:
    """The grammar allows whitespace between JSON tokens (vLLM's default), which a random model
    would pick forever: a bias against whitespace lets it close the object within max_tokens."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    spaces = {str(i): -100 for i in range(tokenizer.vocab_size)
              if (text := tokenizer.decode([i], skip_special_tokens=False)) and not text.strip()}
    body = {"messages": CHAT, "max_tokens": 40, "temperature": 0, "logit_bias": spaces,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}
    whole = post(server, "/chat/completions", body)["choices"][0]["message"]["content"]
    reply = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, **body, "stream": True},
                       timeout=60)
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == whole and json.loads(whole)["answer"] in ("yes", "no")


def test_a_schema_that_is_not_one_is_a_400_naming_response_format(server: LiveServer) -> None:
    reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 5}}}})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "response_format"
