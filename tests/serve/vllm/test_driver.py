"""`tropical serve --engine vllm` against fake vLLM instances: both paths, the P/D hand-off
protocol, greedy equality with a single instance, SLO headers, API key, a killed instance, and
every policy."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import linear_model
from tests.live_server import eventually
from tests.serve.vllm.fake_vllm import FakeVllm, RunningFake, answer, running_fake
from tropical.engine.loader import load_model
from tropical.sched.registry import make_policy, policy_names
from tropical.serve.http.app import ServerState
from tropical.serve.options import ServeOptions
from tropical.serve.process import free_port
from tropical.serve.server import build_app, server_state

MODEL = "tiny-random"
KEY = "k"
PROMPT = "the quick brown fox"
Fakes = tuple[RunningFake, RunningFake]


@contextmanager
def serving(options: ServeOptions, state: ServerState | None = None) -> Iterator[str]:
    """The router app on a free port in a thread of this process, up once /health says ok."""
    app = build_app(options, state or server_state(options))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{options.port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1 ms per prompt token: the long prompt below is predicted to hold the prefill instance for
    3 s, so a request sent while it runs has its TTFT at risk there however slow the machine."""
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    path.write_text(json.dumps(linear_model(prefill_per_token=1e-3).to_dict()))
    return path


@pytest.fixture
def fakes() -> Iterator[Fakes]:
    eos = load_model(MODEL).tokenizer.eos_token_ids[0]
    with ExitStack() as stack:
        yield (stack.enter_context(running_fake(FakeVllm(MODEL, eos=eos))),
               stack.enter_context(running_fake(FakeVllm(MODEL, eos=eos))))


@pytest.fixture
def router(fakes: Fakes, profile: Path, tmp_path: Path) -> Iterator[str]:
    prefill, multiplex = fakes
    urls = f"prefill={prefill.url},multiplex={multiplex.url}"
    options = ServeOptions(model=MODEL, engine="vllm", worker_urls=urls, profile=str(profile),
                           port=free_port(), api_key=KEY, vllm_out=str(tmp_path))
    with serving(options) as url:
        yield url


def post(url: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 16,
                                                      "temperature": 0, **body},
                      headers={"authorization": f"Bearer {KEY}", **headers}, timeout=30)


def expected_text(max_tokens: int = 16) -> str:
    """What one fake instance alone answers to PROMPT, decoded by the model's tokenizer."""
    tokenizer = load_model(MODEL).tokenizer
    return tokenizer.decode(answer(tokenizer.encode(PROMPT), max_tokens, 512, tokenizer.eos_token_ids[0]))


def streamed_text(response: httpx.Response) -> str:
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_path1_hands_the_kv_off_to_the_decode_instance(router: str, fakes: Fakes) -> None:
    reply = post(router, {})
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tropical-path"] == "prefill"
    prefill, multiplex = fakes
    assert prefill.fake.requests[-1]["max_tokens"] == 1
    assert prefill.fake.requests[-1]["kv_transfer_params"]["do_remote_decode"] is True
    assert len(multiplex.fake.pulled) == 1, "the decode instance must pull the KV, not recompute the prompt"
    assert reply.json()["choices"][0]["text"] == expected_text()


def test_under_load_a_request_whose_ttft_is_at_risk_goes_straight_to_the_multiplexing_instance(
        router: str, fakes: Fakes) -> None:
    prefill, multiplex = fakes
    prefill.fake.prefill_s_per_token = 1e-3  # the fake holds the long prompt for the 3 s predicted
    long = threading.Thread(target=post, args=(router, {"prompt": "fish " * 1000, "max_tokens": 2}))
    long.start()
    assert eventually(lambda: len(prefill.fake.requests) == 1), "the long prompt never reached the prefill"
    reply = post(router, {}, **{"x-slo-ttft-ms": "50"})
    long.join()
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tropical-path"] == "multiplex", "Path 1 would queue behind the long prompt"
    assert [len(r["prompt"]) > 1000 for r in prefill.fake.requests] == [True]
    assert reply.json()["choices"][0]["text"] == expected_text()


def test_streams_and_whole_replies_carry_the_same_text_and_usage(router: str) -> None:
    whole = post(router, {}).json()
    stream = post(router, {"stream": True, "stream_options": {"include_usage": True}})
    assert streamed_text(stream) == whole["choices"][0]["text"] == expected_text()
    usage = json.loads([line for line in stream.text.splitlines() if '"usage"' in line][-1][6:])["usage"]
    assert usage == whole["usage"]


def test_errors_and_api_key_behave_as_with_our_engine(router: str) -> None:
    assert post(router, {}, authorization="Bearer wrong").status_code == 401
    assert post(router, {"model": "other"}).status_code == 404
    assert post(router, {"max_tokens": 10**6}).status_code == 400


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition: 0 where none is exported."""
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and s.labels == labels)


def test_metrics_count_paths_and_hand_offs(router: str) -> None:
    post(router, {})
    text = httpx.get(f"{router}/metrics").text
    assert sample(text, "tropical_path_decisions_total", path="prefill") == 1
    assert sample(text, "tropical_migrations_total") == sample(text, "tropical_migration_seconds_count") == 1
    assert sample(text, "tropical_migration_seconds_sum") > 0


def test_a_killed_prefill_instance_is_survived(router: str, fakes: Fakes) -> None:
    prefill, _ = fakes
    prefill.kill()
    reply = post(router, {})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == expected_text()
    assert reply.headers["x-tropical-path"] in ("fallback", "multiplex")
    health = httpx.get(f"{router}/health").json()
    assert [w["alive"] for w in health["workers"]] == [False, True]


def test_a_killed_decode_instance_fails_requests_cleanly_then_refuses_new_ones(
        router: str, fakes: Fakes) -> None:
    _, multiplex = fakes
    multiplex.kill()
    first = post(router, {})
    assert first.status_code in (500, 503) and "no live" in first.json()["error"]["message"]
    assert [w["alive"] for w in httpx.get(f"{router}/health").json()["workers"]] == [True, False]
    assert post(router, {}).status_code == 503


def test_profile_server_fits_a_profile_over_http(tmp_path: Path) -> None:
    from tropical.calibration.store import load_profile
    from tropical.cli import main

    out = tmp_path / "server.json"
    with running_fake(FakeVllm(MODEL, prefill_s_per_token=1e-4, step_s=0.002)) as fake:
        assert main(["profile", "--server", fake.url, "--out", str(out)]) == 0
    fitted = load_profile(out)
    assert fitted.prefill_per_token > 0, "the fake's prefill grows with the prompt"
    assert fitted.decode_intercept + fitted.decode_per_seq > 0


def test_a_stop_string_ends_the_reply_where_it_appears(router: str) -> None:
    whole = expected_text()
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    reply = post(router, {"stop": [stop]}).json()["choices"][0]
    assert reply["text"] == whole[:whole.index(stop)] and reply["finish_reason"] == "stop"


def test_attached_instances_name_the_model_clients_use(profile: Path, tmp_path: Path) -> None:
    with running_fake(FakeVllm("served-as")) as a, running_fake(FakeVllm("served-as")) as b:
        urls = f"prefill={a.url},multiplex={b.url}"
        options = ServeOptions(model=MODEL, engine="vllm", worker_urls=urls, profile=str(profile),
                               port=free_port(), vllm_out=str(tmp_path))
        with serving(options) as url:
            assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["served-as"]
            body = {"model": "served-as", "prompt": PROMPT}
            reply = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_over_vllm(name: str, profile: Path, tmp_path: Path) -> None:
    roles = make_policy(name).roles(2)
    with ExitStack() as stack:
        fakes = [stack.enter_context(running_fake(FakeVllm(MODEL))) for _ in roles]
        urls = ",".join(f"{role.value}={fake.url}" for role, fake in zip(roles, fakes, strict=True))
        options = ServeOptions(model=MODEL, engine="vllm", policy=name, worker_urls=urls,
                               profile=str(profile), port=free_port(), vllm_out=str(tmp_path))
        with serving(options) as url:
            replies = [httpx.post(f"{url}/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}) for _ in range(3)]
    assert [r.status_code for r in replies] == [200] * 3, replies[0].text
    tokenizer = load_model(MODEL).tokenizer
    assert {r.json()["choices"][0]["text"] for r in replies} == {
        tokenizer.decode(answer(tokenizer.encode(PROMPT), 16, 512, None))}
    assert sum(len(f.fake.requests) for f in fakes) >= 3


def test_sampling_controls_reach_the_instances_and_what_cannot_come_back_is_refused(
        router: str, fakes: Fakes) -> None:
    reply = post(router, {"presence_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {"7": -100},
                          "min_tokens": 3, "temperature": 0.5, "seed": 3})
    assert reply.status_code == 200, reply.text
    sent = [r for fake in fakes for r in fake.fake.requests][-1]
    wanted = {"presence_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {"7": -100.0},
              "min_tokens": 3}
    assert {name: sent.get(name) for name in wanted} == wanted
    assert "frequency_penalty" not in sent  # unset controls are left to vLLM's defaults
    before = sum(len(fake.fake.requests) for fake in fakes)
    for fields in ({"logprobs": 1}, {"stop_token_ids": [5]}, {"echo": True, "logprobs": 0}):
        refused = post(router, fields)
        assert refused.status_code == 400 and "--engine vllm" in refused.json()["error"]["message"]
    assert sum(len(fake.fake.requests) for fake in fakes) == before
