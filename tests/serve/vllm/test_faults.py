"""`tropical serve --engine vllm` starting its instances (fake vLLM processes, killed for real):
a dead instance's requests end as with our own workers (rerun before their first token, an error
event after it), the instance is restarted with its role and port and re-added, and a drain ends
the streams it outlives with an error event and [DONE]."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import linear_model
from tests.live_server import LiveServer, eventually, live_server, stop
from tests.serve.vllm.fake_vllm import answer, fake_vllm_python
from tropical.engine.loader import load_model

MODEL = "tiny-random"
PROMPT = "the quick brown fox"


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """1 prefill + 1 multiplexing fake instance behind the router; a prompt token takes 5 ms to
    prefill and a decode step 50 ms, so a request is caught in either phase."""
    monkeypatch.setenv("FAKE_VLLM_PREFILL_S", "0.005")
    monkeypatch.setenv("FAKE_VLLM_STEP_S", "0.05")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(linear_model().to_dict()))
    with live_server(tmp_path, "--engine", "vllm", "--vllm-python", str(fake_vllm_python(tmp_path)),
                     "--vllm-out", str(tmp_path), "--profile", str(profile), "--drain-timeout", "1",
                     model=MODEL) as s:
        yield s


def body(**overrides: object) -> dict:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, **overrides}


def expected_text(prompt: str = PROMPT, max_tokens: int = 16) -> str:
    tokenizer = load_model(MODEL).tokenizer
    return tokenizer.decode(answer(tokenizer.encode(prompt), max_tokens, 512, None))


def metric(server: LiveServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def pids(server: LiveServer) -> list[int]:
    return [w["pid"] for w in server.health()["workers"]]


def revived(server: LiveServer, old: int) -> bool:
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    workers = health.get("workers", [])
    return (health["status"] == "ok" and all(w["alive"] for w in workers)
            and old not in [w["pid"] for w in workers])


def test_a_killed_instance_is_restarted_with_its_role_and_port_and_serves_again(server: LiveServer) -> None:
    before = server.health()["workers"]
    victim = before[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    assert eventually(lambda: revived(server, victim), 60), server.health()
    after = server.health()["workers"]
    assert [(w["role"], w["node"]) for w in after] == [(w["role"], w["node"]) for w in before]
    assert metric(server, "tropical_worker_revivals_total", worker="0") == 1
    reply = httpx.post(f"{server.url}/v1/completions", json=body(), timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == expected_text()


def test_a_request_without_a_token_yet_runs_again_elsewhere_when_its_instance_dies(
        server: LiveServer) -> None:
    prompt = "fish " * 400  # 2 s of prefill on the prefill instance
    replies: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: replies.append(httpx.post(
        f"{server.url}/v1/completions", json=body(prompt=prompt), timeout=60)))
    asking.start()
    assert eventually(lambda: metric(server, "tropical_path_decisions_total", path="prefill") == 1, 30)
    os.kill(pids(server)[0], signal.SIGKILL)
    asking.join(60)
    [reply] = replies
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == expected_text(prompt)
    assert metric(server, "tropical_requests_total", outcome="rerun") == 1


def test_a_stream_whose_instance_dies_after_its_first_token_ends_with_an_error_event(
        server: LiveServer) -> None:
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body(max_tokens=200, stream=True),
                      timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(pids(server)[1], signal.SIGKILL)  # the multiplexing instance: every stream decodes there
        rest = [line for line in lines if line]
    assert '"error"' in rest[-2] and "died" in rest[-2] and rest[-1] == "data: [DONE]"
    assert metric(server, "tropical_requests_total", outcome="rerun") == 0


def test_a_drain_ends_the_streams_it_outlives_with_an_error_event(server: LiveServer) -> None:
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body(max_tokens=1000, stream=True),
                      timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(server.pid, signal.SIGTERM)
        rest = [line for line in lines if line]
    assert "drain timeout" in rest[-2] and '"error"' in rest[-2] and rest[-1] == "data: [DONE]"
    assert stop(server) in (0, -signal.SIGTERM)
