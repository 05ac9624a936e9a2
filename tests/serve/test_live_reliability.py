"""A live server under a hostile but fair client: bodies that break parsers, bodies too big to
read, text too long to tokenize, samplers pushed to their limits, clients that give up. Each gets
a clear 4xx (or its answer) in bounded time, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, eventually, live_server

MODEL = "tiny-random"
TIMEOUT = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("serve"), "--policy", "colocated", "--max-model-len", "2048",
                     "--max-body-mb", "1") as s:
        yield s


def _post(server: LiveServer, body: bytes | dict, path: str = "/v1/completions",
          timeout: float = TIMEOUT) -> httpx.Response:
    if isinstance(body, dict):
        return httpx.post(f"{server.url}{path}", json=body, timeout=timeout)
    return httpx.post(f"{server.url}{path}", content=body, timeout=timeout,
                      headers={"content-type": "application/json"})


def _outcomes(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "tropical_requests")
    return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_a_temperature_too_small_to_divide_by_samples_greedily_and_the_server_serves_on(
        server: LiveServer) -> None:
    tiny = _post(server, {"model": MODEL, "prompt": "hello", "max_tokens": 5, "temperature": 1e-40})
    greedy = _post(server, {"model": MODEL, "prompt": "hello", "max_tokens": 5, "temperature": 0})
    assert tiny.status_code == greedy.status_code == 200
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "tiny-random", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "max_tokens"),
    (b'{"model": "tiny-random", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "prompt"),
    (b'{"model": "tiny-random", "prompt": "hi \\ud800"}', "prompt"),
])
def test_json_that_breaks_parsers_is_a_400_naming_the_field(server: LiveServer, raw: bytes,
                                                            param: str) -> None:
    reply = _post(server, raw)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


def test_a_lone_surrogate_in_a_chat_message_is_a_400(server: LiveServer) -> None:
    raw = b'{"model": "tiny-random", "messages": [{"role": "user", "content": "\\udfff"}]}'
    reply = _post(server, raw, "/v1/chat/completions")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages"


def test_a_body_over_the_limit_is_413_and_health_stays_ok(server: LiveServer) -> None:
    reply = _post(server, {"model": MODEL, "prompt": "a " * 1_000_000, "max_tokens": 5})
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large" and "--max-body-mb" in reply.text
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_text_far_beyond_the_context_is_refused_before_tokenizing(server: LiveServer) -> None:
    reply = _post(server, {"model": MODEL, "prompt": "ab " * 100_000, "max_tokens": 5})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded" and "characters" in reply.text


def test_unknown_paths_and_methods_get_openai_error_bodies(server: LiveServer) -> None:
    missing = httpx.get(f"{server.url}/v1/nothing", timeout=5)
    wrong_method = httpx.get(f"{server.url}/v1/completions", timeout=5)
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert missing.json()["error"]["type"] == "not_found_error" and "detail" not in missing.json()
    assert wrong_method.json()["error"]["message"]


def test_an_unsupported_field_is_a_400_naming_it(server: LiveServer) -> None:
    reply = _post(server, {"model": MODEL, "prompt": "hi", "suffix": "!"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "suffix"


def test_a_non_streaming_client_that_leaves_aborts_its_request(server: LiveServer) -> None:
    before = _outcomes(server)
    with pytest.raises(httpx.TimeoutException):
        _post(server, {"model": MODEL, "prompt": "go", "max_tokens": 1000, "ignore_eos": True}, timeout=0.5)
    assert eventually(lambda: _outcomes(server).get("aborted", 0) == before.get("aborted", 0) + 1, 20)
    assert _outcomes(server).get("finished", 0) == before.get("finished", 0), "it must not run to the end"
