"""A live server under abuse: clients that vanish, a worker that dies, overload, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, eventually, live_server, stop

BODY = {"model": "tiny-random", "prompt": "keep talking", "temperature": 0, "ignore_eos": True}


def _gauges(server: LiveServer, name: str) -> list[float]:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return [s.value for s in family.samples]


async def _read_one_chunk_and_leave(url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client, client.stream(
            "POST", f"{url}/v1/completions", json={**BODY, "max_tokens": 200, "stream": True}) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                return


def test_fifty_clients_leaving_mid_stream_free_all_kv(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "disagg") as server:
        async def main() -> None:
            await asyncio.gather(*(_read_one_chunk_and_leave(server.url) for _ in range(50)))
        asyncio.run(main())
        assert eventually(lambda: not any(_gauges(server, "tropical_worker_kv_usage"))
                           and not any(_gauges(server, "tropical_worker_running"))
                           and not any(_gauges(server, "tropical_worker_waiting"))), \
            httpx.get(f"{server.url}/metrics", timeout=5).text
        after = httpx.post(f"{server.url}/v1/completions", json={**BODY, "max_tokens": 4}, timeout=30)
        assert after.status_code == 200
        assert "Traceback" not in server.output()


def _stream_until_killed(server: LiveServer) -> tuple[str, str]:
    """Start a long stream, kill the worker it runs on, return (worker id, what the stream said)."""
    body = {**BODY, "max_tokens": 900, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as reply:
        worker = reply.headers["x-tropical-prefill-worker"]
        pid = next(w["pid"] for w in server.health()["workers"] if str(w["id"]) == worker)
        os.kill(pid, signal.SIGKILL)
        return worker, "".join(reply.iter_lines())


def test_a_dead_worker_fails_its_requests_and_the_rest_keep_serving(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "colocated", "--max-model-len", "1024") as server:
        worker, said = _stream_until_killed(server)
        assert "died" in said and '"error"' in said
        assert eventually(lambda: not next(w for w in server.health()["workers"]
                                            if str(w["id"]) == worker)["alive"])
        for _ in range(3):
            reply = httpx.post(f"{server.url}/v1/completions", json={**BODY, "max_tokens": 5}, timeout=30)
            assert reply.status_code == 200 and reply.headers["x-tropical-prefill-worker"] != worker
        assert _gauges(server, "tropical_worker_up").count(0.0) == 1


def test_losing_every_decoding_worker_answers_503(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "disagg") as server:
        decode = next(w for w in server.health()["workers"] if w["role"] == "decode")
        os.kill(decode["pid"], signal.SIGKILL)
        assert eventually(lambda: not server.health()["workers"][decode["id"]]["alive"])
        reply = httpx.post(f"{server.url}/v1/completions", json={**BODY, "max_tokens": 5}, timeout=30)
        assert reply.status_code == 503 and "decodes" in reply.json()["error"]["message"]
        health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503 and "decodes" in health.json()["reason"], "health tells the truth"


def test_a_non_streaming_request_whose_worker_dies_mid_generation_gets_503(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "colocated", "--workers", "1") as server:
        pid = server.health()["workers"][0]["pid"]
        with ThreadPoolExecutor(1) as pool:
            reply = pool.submit(httpx.post, f"{server.url}/v1/completions",
                                json={**BODY, "max_tokens": 1000}, timeout=60)
            assert eventually(lambda: any(_gauges(server, "tropical_worker_running")), 20)
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            answer = reply.result(60)
        assert answer.status_code == 503, answer.text
        assert "died after this request had generated" in answer.json()["error"]["message"]


def test_overload_answers_429_with_a_reason(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "colocated", "--workers", "1", "--max-waiting", "2") as server:
        async def flood() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(client.post(f"{server.url}/v1/completions", json={
                    **BODY, "prompt": "flood " * 100, "max_tokens": 20}) for _ in range(40)))
        replies = asyncio.run(flood())
        codes = [r.status_code for r in replies]
        assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 2
        rejected = next(r for r in replies if r.status_code == 429).json()["error"]
        assert "overloaded" in rejected["message"] and rejected["type"] == "rate_limit_exceeded"
        assert server.health()["status"] == "ok"


def test_sigterm_drains_requests_in_flight(tmp_path: Path) -> None:
    with live_server(tmp_path, "--policy", "tropical") as server, httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**BODY, "max_tokens": 300, "stream": True,
                                                           "stream_options": {"include_usage": True}},
            timeout=60) as reply:
        lines = reply.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        os.kill(server.pid, signal.SIGTERM)
        rest = [line for line in lines if line]
        assert first and rest[-1] == "data: [DONE]"
        assert '"completion_tokens":300' in "".join(rest)
        assert stop(server) in (0, -signal.SIGTERM), "uvicorn re-raises SIGTERM once drained"
        assert "draining" in server.output() and "stopped" in server.output()


def test_sigterm_answers_503_meanwhile_and_ends_streams_past_the_drain_timeout_with_an_error(
        tmp_path: Path) -> None:
    # Mock workers sleep a real cluster's iteration times, so the 1,000-token stream outlasts the
    # 1 s drain on any machine (the tiny model can finish it inside the drain on a fast one).
    with live_server(tmp_path, "--engine", "mock", "--policy", "colocated", "--drain-timeout", "1") as server:
        body = {**BODY, "model": httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]}
        with httpx.stream("POST", f"{server.url}/v1/completions",
                          json={**body, "max_tokens": 1000, "stream": True}, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            os.kill(server.pid, signal.SIGTERM)
            assert eventually(lambda: httpx.get(f"{server.url}/health", timeout=5).status_code == 503, 5)
            late = httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 5}, timeout=10)
            assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
            rest = [line for line in lines if line]
            assert "drain timeout" in rest[-2] and '"error"' in rest[-2] and rest[-1] == "data: [DONE]"
            assert stop(server) in (0, -signal.SIGTERM)
