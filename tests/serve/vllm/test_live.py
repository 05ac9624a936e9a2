"""`tropical serve --engine vllm` over real vLLM instances (1 prefill + 1 multiplexing, SmolLM2,
NIXL hand-off on CPU), and a killed instance revived. Runs only where `bash scripts/setup-vllm.sh`
has installed vLLM into .venv-vllm; CI does not, so there it is skipped with that message. Slow:
minutes to start."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, eventually, live_server

VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
pytestmark = pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="vLLM is not installed: run "
                                "`bash scripts/setup-vllm.sh` for the live vLLM test")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("vllm")
    with live_server(tmp, "--engine", "vllm", "--vllm-python", str(VLLM_PYTHON), "--vllm-out", str(tmp),
                     "--max-model-len", "2048", model="smollm2", timeout=1500) as s:
        yield s


def chat(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
        "model": "smollm2", "messages": QUESTION, "temperature": 0, "max_tokens": 24, **body})


def test_both_paths_answer_the_same_greedy_text(server: LiveServer) -> None:
    path1 = chat(server)
    path2 = chat(server, slo_ttft_ms=1)
    assert path1.status_code == path2.status_code == 200, (path1.text, path2.text)
    assert path1.headers["x-tropical-path"] == "prefill"
    assert path2.headers["x-tropical-path"] in ("multiplex", "fallback")
    assert "Paris" in path1.json()["choices"][0]["message"]["content"]
    assert path1.json()["choices"][0]["message"] == path2.json()["choices"][0]["message"]


def migrations(server: LiveServer) -> tuple[float, float]:
    """The hand-offs counted so far and the seconds they took."""
    text = httpx.get(f"{server.url}/metrics").text
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return samples["tropical_migration_seconds_count"], samples["tropical_migration_seconds_sum"]


def test_the_hand_off_is_measured(server: LiveServer) -> None:
    """Exported as 0 from the start, so only a count that grows with a Path 1 reply shows one."""
    count, seconds = migrations(server)
    reply = chat(server)
    assert reply.status_code == 200 and reply.headers["x-tropical-path"] == "prefill", reply.text
    after, after_seconds = migrations(server)
    assert after == count + 1 and after_seconds > seconds


def test_a_killed_prefill_instance_is_survived_and_revived(server: LiveServer) -> None:
    """Last in the module: it restarts an instance (minutes)."""
    prefill = server.health()["workers"][0]
    os.kill(prefill["pid"], signal.SIGKILL)
    reply = chat(server)
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]

    def revived() -> bool:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        workers = health.get("workers", [])
        restarted = workers[0]["pid"] != prefill["pid"]
        return health["status"] == "ok" and all(w["alive"] for w in workers) and restarted

    assert eventually(revived, 900), server.health()
    again = chat(server)
    assert again.status_code == 200 and again.headers["x-tropical-path"] == "prefill", again.text
