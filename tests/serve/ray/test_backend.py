"""`tropical serve --backend ray`: the same tokens as the local backend, KV migrated through Ray's
object store, and worker actors that die mid-request and come back.

One server (a private Ray instance on this machine, 2 prefill + 1 decode actors) serves every
test here, since starting Ray costs seconds; each test leaves every worker alive again.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_server import LiveServer, eventually, live_server, until
from tests.serve.greedy import PROMPTS, complete_all

BODY = {"model": "tiny-random", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("ray"), "--backend", "ray", "--policy", "disagg",
                     "--workers", "prefill,prefill,decode") as running:
        yield running


def _samples(server: LiveServer, name: str) -> list:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return next(f for f in text_string_to_metric_families(text) if f.name == name).samples


def _counter(server: LiveServer, name: str, **labels: str) -> float:
    return sum(s.value for s in _samples(server, name)
               if s.name.endswith("_total") and labels.items() <= s.labels.items())


def _worker(server: LiveServer, worker_id: int) -> dict:
    return next(w for w in server.health()["workers"] if w["id"] == worker_id)


def _revived(server: LiveServer, worker_id: int, old_pid: int) -> bool:
    worker = _worker(server, worker_id)
    return worker["alive"] and worker["pid"] != old_pid


def test_ray_actors_serve_the_local_backends_tokens_migrating_kv_through_the_object_store(
        server: LiveServer, reference: list[str]) -> None:
    """``reference`` is the engine's own greedy output, which test_live_policies shows the local
    backend serving under every policy."""
    before = _counter(server, "tropical_migrations")
    texts, paths = asyncio.run(complete_all(server.url))
    assert texts == reference and set(paths) == {"prefill"}
    assert _counter(server, "tropical_migrations") - before == len(PROMPTS)
    nodes = {w["node"] for w in server.health()["workers"]}
    assert len(nodes) == 1 and "local" not in nodes
    assert {s.labels["node"] for s in _samples(server, "tropical_worker_up")} == nodes


async def _send_in_turn(client: httpx.AsyncClient, server: LiveServer,
                        bodies: list[dict]) -> list[asyncio.Task[httpx.Response]]:
    """Send ``bodies`` in order, each once the policy has placed the one before; return when
    all are placed, with their replies still to come."""
    before, sent = _counter(server, "tropical_path_decisions"), []
    for placed, body in enumerate(bodies, start=1):
        sent.append(asyncio.create_task(client.post(f"{server.url}/v1/completions", json=body)))
        assert await until(lambda least=before + placed: _counter(server, "tropical_path_decisions") >= least)
    return sent


def test_a_killed_actors_waiting_requests_rerun_on_the_other_worker_unless_told_not_to(
        server: LiveServer, reference: list[str]) -> None:
    """Both prefill actors frozen, four requests alternate between them (fewest tokens, lowest id
    first); killing actor 0 reruns its retryable request on actor 1 and fails the other."""
    pids = [_worker(server, i)["pid"] for i in (0, 1)]
    reruns = _counter(server, "tropical_requests", outcome="rerun")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    bodies = [{**BODY, "prompt": PROMPTS[0], "retry": False}] + [{**BODY, "prompt": PROMPTS[0]}] * 3

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=90) as client:
            replies = await _send_in_turn(client, server, bodies)
            os.kill(pids[0], signal.SIGKILL)
            os.kill(pids[1], signal.SIGCONT)
            return list(await asyncio.gather(*replies))

    replies = asyncio.run(scenario())
    assert replies[0].status_code == 503 and "asked not to be retried" in replies[0].text
    assert [r.json()["choices"][0]["text"] for r in replies[1:]] == [reference[0]] * 3
    assert {r.headers["x-tropical-prefill-worker"] for r in replies[1:]} == {"1"}
    assert _counter(server, "tropical_requests", outcome="rerun") - reruns == 1
    assert eventually(lambda: _revived(server, 0, pids[0]), timeout=60), server.health()
    assert _counter(server, "tropical_worker_revivals", worker="0") >= 1
    back = httpx.post(f"{server.url}/v1/completions", json={**BODY, "prompt": PROMPTS[1]}, timeout=30)
    assert back.headers["x-tropical-prefill-worker"] == "0", "idle workers tie; the lowest id wins"
    assert back.json()["choices"][0]["text"] == reference[1]


def test_a_decoding_actor_killed_mid_stream_ends_its_stream_with_an_error_then_comes_back(
        server: LiveServer, reference: list[str]) -> None:
    decode = _worker(server, 2)
    body = {**BODY, "prompt": PROMPTS[2], "max_tokens": 900, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(decode["pid"], signal.SIGKILL)
        said = "".join(lines)
    assert '"error"' in said and "died" in said and "[DONE]" in said
    assert eventually(lambda: _revived(server, 2, decode["pid"]), timeout=60), server.health()
    texts, _ = asyncio.run(complete_all(server.url))
    assert texts == reference
    assert [s.value for s in _samples(server, "tropical_worker_up")] == [1.0, 1.0, 1.0]
