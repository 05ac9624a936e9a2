"""The router over mock workers on a virtual clock: every iteration takes exactly what the mock's
profile predicts for the batch the router planned, every policy serves every request, and the
mock's answer is the same text whoever runs it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.serve.fake_cluster import finished, run_virtual, submit_at_arrivals
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.sched.fleet import worker_states
from tropical.sched.registry import make_policy, policy_names
from tropical.serve.iteration_log import IterationLog, read_iterations, read_migrations
from tropical.serve.metrics import ServerMetrics
from tropical.serve.mock.model import ANSWER, MockModel, mock_model
from tropical.serve.mock.worker import MockWorker
from tropical.serve.options import ServeOptions
from tropical.serve.router import Router, RouterSettings
from tropical.serve.workers.messages import Free, Profile

MAIN_POLICIES = ["colocated", "chunked-512", "disagg", "kv-router", "tropical", "tropical+"]


def arrivals(seed: int = 5, count: int = 24) -> list[Request]:
    """Short and long prompts close enough together to queue, chunk, multiplex and migrate."""
    rng = random.Random(seed)
    requests, now = [], 0.0
    for rid in range(count):
        now += rng.expovariate(20.0)
        prompt = rng.choice([rng.randint(20, 300), rng.randint(1500, 3000)])
        requests.append(Request(rid, now, prompt, rng.randint(2, 12), SLO(0.5, 0.1)))
    return requests


def serve_virtually(policy_name: str, model: MockModel, log: Path, workers: int = 4,
                    prefix_cache: bool = True) -> list[list]:
    """Every request of ``arrivals`` through a router over mock workers; their streams' events."""
    policy = make_policy(policy_name)
    states = worker_states(policy, policy.roles(workers), [(model.num_blocks, model.block_size)] * workers,
                           [model.latency] * workers, prefix_cache)

    async def main(loop: asyncio.AbstractEventLoop) -> list[list]:
        mocks = [MockWorker(i, model) for i in range(workers)]
        router = Router(policy, states, mocks, model.tokenizer, model.latency,
                        RouterSettings(max_waiting=10**6), ServerMetrics(), clock=loop.time,
                        iteration_log=IterationLog(log))
        router.start()
        handles = await submit_at_arrivals(loop, router, arrivals())
        events = [await finished(h) for h in handles]
        await router.stop()
        router.iteration_log.close()
        return events

    return run_virtual(main)


@pytest.fixture(scope="module")
def model() -> MockModel:
    return mock_model(ServeOptions(engine="mock", max_model_len=8192))


@pytest.mark.parametrize("policy", MAIN_POLICIES)
def test_every_iteration_takes_what_the_profile_predicts_for_its_batch(tmp_path: Path, model: MockModel,
                                                                        policy: str) -> None:
    serve_virtually(policy, model, tmp_path / "it.jsonl")
    records = read_iterations(tmp_path / "it.jsonl")
    assert any(r.shape.num_prefills for r in records) and any(r.shape.decode_count for r in records)
    for r in records:
        assert r.predicted == model.latency.iteration_time(r.shape)
        assert r.compute == pytest.approx(r.predicted, rel=1e-9), r
        assert r.wall >= r.compute  # a step waits for a KV export running on its worker


@pytest.mark.parametrize("policy", policy_names())
def test_the_router_serves_every_request_with_mock_workers(tmp_path: Path, model: MockModel,
                                                           policy: str) -> None:
    events = serve_virtually(policy, model, tmp_path / "it.jsonl")
    texts = ["".join(e.text for e in stream if e.text) for stream in events]
    assert all(stream[-1].error is None for stream in events)
    assert [len(t) > 0 for t in texts] == [True] * len(texts)
    assert all(t.strip() in ANSWER * 2 for t in texts), texts
    if policy in ("disagg", "kv-router-disagg", "tropical"):
        assert read_migrations(tmp_path / "it.jsonl"), "no prefill migrated to a decode worker"


def test_a_migration_takes_the_links_transfer_time(tmp_path: Path, model: MockModel) -> None:
    """Without a prefix cache a migration moves the whole prompt; staging it may first wait for
    the step running on its source, importing it takes no time of its own."""
    serve_virtually("disagg", model, tmp_path / "it.jsonl", prefix_cache=False)
    moves = read_migrations(tmp_path / "it.jsonl")
    ratios = [(m.exported - m.staged) / model.latency.transfer_time(m.tokens) for m in moves]
    assert min(ratios) == pytest.approx(1.0, rel=1e-6)
    assert all(r >= 1 - 1e-6 for r in ratios)
    assert all(m.imported == m.landed for m in moves)


def test_a_time_scale_scales_every_iteration(tmp_path: Path) -> None:
    base, fast = (mock_model(ServeOptions(engine="mock", mock_time_scale=s)) for s in (1.0, 0.1))
    serve_virtually("tropical", fast, tmp_path / "it.jsonl")
    for r in read_iterations(tmp_path / "it.jsonl"):
        assert r.compute == pytest.approx(0.1 * base.latency.iteration_time(r.shape), rel=1e-9)


def test_the_mock_answers_commands_one_at_a_time_and_refuses_what_it_cannot_run(model: MockModel) -> None:
    async def main() -> None:
        worker = MockWorker(3, model)
        ready = await worker.ready(1.0)
        assert (ready.worker_id, ready.model_name, ready.staging) == (3, "mock-internlm2-20b", None)
        assert await worker.call(Free([1, 2])) is None
        with pytest.raises(Exception, match="worker 3: the mock engine cannot run Profile"):
            await worker.call(Profile("quick"))
        worker.stop()
        with pytest.raises(Exception, match="worker 3 is not running"):
            await worker.call(Free([1]))

    asyncio.run(main())


def test_the_main_policies_are_registered() -> None:
    assert set(MAIN_POLICIES) <= set(policy_names())
