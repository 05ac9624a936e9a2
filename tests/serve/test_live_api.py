"""The OpenAI API of a live `tropical serve` (tiny-random, tropical policy, API key), through the
real openai client and raw HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, live_server

KEY = "test-key"
MODEL = "tiny-random"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("serve")
    (tmp / "key").write_text(KEY + "\n")
    with live_server(tmp, "--api-key-file", str(tmp / "key"), "--max-model-len", "256") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def _post(server: LiveServer, path: str, body: bytes | dict, key: str = KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if isinstance(body, dict):
        return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=30)
    return httpx.post(f"{server.url}{path}", content=body, headers=headers, timeout=30)


def test_start_up_says_where_it_listens(server: LiveServer) -> None:
    out = server.output()
    assert f"listening on {server.url}" in out and "curl" in out
    assert [w["role"] for w in server.health()["workers"]] == ["prefill", "multiplex"]


def test_completion_and_usage(client: openai.OpenAI) -> None:
    done = client.completions.create(model=MODEL, prompt="hello world", max_tokens=7, temperature=0)
    assert done.usage.completion_tokens == 7 and done.usage.prompt_tokens > 0
    assert done.choices[0].finish_reason == "length" and done.choices[0].text


def test_chat_and_stream_agree(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is a tropical fish?"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 12


def test_streamed_completion_matches_whole(client: openai.OpenAI) -> None:
    args = {"model": MODEL, "prompt": [5, 17, 42, 99, 3], "max_tokens": 9, "temperature": 0}
    whole = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert streamed == whole


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    """Equal seeds give equal text and other seeds other text: sampling, not greedy, ran."""
    def sampled(seed: int, temperature: float = 1.0) -> str:
        return client.completions.create(model=MODEL, prompt="seeded", max_tokens=10, seed=seed,
                                         temperature=temperature).choices[0].text

    first, second, other, greedy = sampled(7), sampled(7), sampled(8), sampled(7, temperature=0)
    assert first == second and len({first, other, greedy}) == 3


def test_stop_string_ends_the_text(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="abc", max_tokens=30, temperature=0).choices[0].text
    stop = free[3:5]
    cut = client.completions.create(model=MODEL, prompt="abc", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == free[:free.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_path_and_slo_headers(server: LiveServer) -> None:
    """A loose TTFT SLO fits on the idle prefill worker; a 1 µs one (the profile prices this
    prompt near 1 ms) is at risk there, and the reason names the SLO the header gave."""
    def sent(ttft_ms: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {KEY}", "x-slo-ttft-ms": ttft_ms, "x-slo-tpot-ms": "500"}
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        return httpx.post(f"{server.url}/v1/completions", json=body, timeout=30, headers=headers)

    loose, tight = sent("5000"), sent("0.001")
    assert loose.status_code == tight.status_code == 200
    assert loose.headers["x-tropical-path"] == "prefill"
    assert loose.headers["x-tropical-reason"].startswith("fits TTFT SLO on prefill worker")
    assert tight.headers["x-tropical-path"] in ("multiplex", "fallback")
    assert "> SLO 0.000s" in tight.headers["x-tropical-reason"], tight.headers["x-tropical-reason"]


def test_models_and_health(server: LiveServer, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "x", "n": 17}, "n"),
    ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ({"model": MODEL, "prompt": [1, 100000]}, "prompt"),
    ({"model": MODEL, "prompt": "word " * 400}, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 1000}, "max_tokens"),
    ({"prompt": "x"}, "model"),
])
def test_bad_fields_are_400_naming_the_field(server: LiveServer, body: dict, param: str) -> None:
    reply = _post(server, "/v1/completions", body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_malformed_json_unknown_model_and_wrong_key(server: LiveServer) -> None:
    assert _post(server, "/v1/completions", b'{"model":').status_code == 400
    chat = {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
    missing = _post(server, "/v1/chat/completions", chat)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    denied = _post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key="wrong")
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"


def test_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_metrics_parse_and_count(server: LiveServer, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL, prompt="count me", max_tokens=3)
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("tropical_ttft_seconds", "tropical_tpot_seconds", "tropical_queueing_seconds",
                 "tropical_e2e_seconds", "tropical_worker_running", "tropical_worker_kv_usage",
                 "tropical_path_decisions", "tropical_migrations"):
        assert name in families, name
    ttft_count = next(s.value for s in families["tropical_ttft_seconds"].samples if s.name.endswith("_count"))
    assert ttft_count >= 1
    migrations = sum(s.value for s in families["tropical_migrations"].samples if s.name.endswith("_total"))
    assert migrations >= 1, "requests prefilled on the prefill worker migrate to the multiplexing one"


def test_log_file_is_clean(server: LiveServer) -> None:
    assert "Traceback" not in server.output()


def test_the_key_is_never_printed(server: LiveServer) -> None:
    assert KEY not in server.output() and "Authorization: Bearer $TROPICAL_API_KEY" in server.output()


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_api_docs_are_off_behind_a_key(server: LiveServer, path: str) -> None:
    assert httpx.get(f"{server.url}{path}", timeout=5).status_code == 404


def test_health_shows_pids_and_nodes_only_with_the_key(server: LiveServer) -> None:
    probe = httpx.get(f"{server.url}/health", timeout=5).json()
    keyed = httpx.get(f"{server.url}/health", headers={"authorization": f"Bearer {KEY}"}, timeout=5).json()
    assert probe["status"] == "ok" and [w["role"] for w in probe["workers"]] == ["prefill", "multiplex"]
    assert not any("pid" in w or "node" in w for w in probe["workers"])
    assert all(w["pid"] and w["node"] == "local" for w in keyed["workers"])


