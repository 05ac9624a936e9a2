"""The router's logic on fake workers and a virtual clock: streams, stops, aborts, KV frees,
migrations and worker deaths, without a model or a wall clock."""

from __future__ import annotations

import asyncio

import pytest

from tests.factories import linear_cluster, linear_model
from tests.serve.fake_cluster import (
    FakeCluster,
    at,
    finished,
    run_virtual,
    start_router,
    submission,
    submit_at_arrivals,
)
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.engine.block_hash import block_hashes
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rejection import AdmissionMode
from tropical.serve.iteration_log import IterationLog
from tropical.serve.router import Rejected
from tropical.serve.streams import RequestHandle

EOS = 7


def requests(*lengths: tuple[int, int]) -> list[Request]:
    return [Request(i, 0.0, p, o, SLO(1.0, 0.1)) for i, (p, o) in enumerate(lengths)]


def build(policy_name: str, workers: int = 2, kv_tokens: int = 50_000):
    policy = make_policy(policy_name)
    return policy, linear_cluster(workers, kv_tokens).build(policy)


def test_eos_ends_a_request_early_and_frees_its_kv():
    reqs = requests((50, 20), (50, 20))

    async def main(loop):
        policy, workers = build("colocated", workers=1)
        fake = start_router(loop, policy, workers, {0: 50, 1: 50}, eos=[EOS],
                            tokens=lambda rid, step: EOS if (rid, step) == (0, 3) else 1)
        handles = [fake.router.submit(submission(r)) for r in reqs]
        events = [await finished(h) for h in handles]
        await at(loop, loop.time() + 1.0)
        await fake.router.stop()
        return fake, handles, events

    fake, handles, events = run_virtual(main)
    assert events[0][-1].finish_reason == "stop" and handles[0].completion_tokens == 4
    assert events[1][-1].finish_reason == "length" and handles[1].completion_tokens == 20
    assert fake.router.workers[0].kv.used_blocks == 0 and sorted(fake.workers[0].freed) == [0, 1]


def test_a_stop_string_ends_the_stream_and_frees_the_kv_at_the_next_boundary():
    [req] = requests((30, 50))

    async def main(loop):
        policy, workers = build("colocated", workers=1)
        fake = start_router(loop, policy, workers, {0: 30})
        handle = fake.router.submit(submission(req, stop=["bbb"]))
        events = await finished(handle)
        await at(loop, loop.time() + 1.0)
        await fake.router.stop()
        return fake, handle, events

    fake, handle, events = run_virtual(main)
    assert events[-1].finish_reason == "stop" and handle.completion_tokens == 3
    assert fake.workers[0].freed == [0] and fake.router.workers[0].kv.used_blocks == 0
    assert not fake.router.sequences and fake.router.cluster.where(0) is None


def test_a_client_leaving_frees_kv_and_lets_the_queue_behind_it_run():
    first, second = requests((3000, 200), (3000, 5))

    async def main(loop):
        policy, workers = build("colocated", workers=1, kv_tokens=4000)
        fake = start_router(loop, policy, workers, {0: 3000, 1: 3000})
        leaving = fake.router.submit(submission(first))
        staying = fake.router.submit(submission(second))
        await leaving.events.get()
        fake.router.abort(first.id)
        events = await finished(staying)
        await fake.router.stop()
        return fake, staying, events

    fake, staying, events = run_virtual(main)
    assert events[-1].finish_reason == "length" and staying.completion_tokens == 5
    assert 0 in fake.workers[0].freed and fake.router.workers[0].kv.used_blocks == 0


def test_a_disaggregated_request_migrates_and_decodes_on_the_decode_worker():
    [req] = requests((400, 6))

    async def main(loop):
        policy, workers = build("disagg")
        fake = start_router(loop, policy, workers, {0: 400})
        handle = fake.router.submit(submission(req))
        events = await finished(handle)
        await fake.router.stop()
        return fake, handle, events

    fake, handle, events = run_virtual(main)
    assert events[-1].finish_reason == "length" and handle.completion_tokens == 6
    assert handle.req.prefill_worker == 0 and handle.req.decode_worker == 1
    assert handle.req.migration_time == pytest.approx(linear_model().transfer_time(400))
    assert fake.workers[0].freed == [0] and fake.workers[1].freed == [0]


def test_a_dead_worker_reruns_requests_that_streamed_nothing_elsewhere():
    reqs = requests((2000, 4), (2000, 4))

    async def main(loop):
        policy, workers = build("colocated")
        fake = start_router(loop, policy, workers, {0: 2000, 1: 2000})
        handles = [fake.router.submit(submission(r)) for r in reqs]
        doomed = next(h for h in handles if h.req.prefill_worker == 0)
        fake.workers[0].kill()
        events = await finished(doomed)
        await fake.router.stop()
        return fake, doomed, events

    fake, doomed, events = run_virtual(main)
    assert events[-1].finish_reason == "length" and doomed.completion_tokens == 4
    assert doomed.req.prefill_worker == 1 and not fake.router.workers[0].alive


def test_a_dead_worker_fails_requests_that_already_streamed():
    [req] = requests((100, 400))

    async def main(loop):
        policy, workers = build("colocated", workers=1)
        fake = start_router(loop, policy, workers, {0: 100})
        handle = fake.router.submit(submission(req))
        await handle.events.get()
        fake.workers[0].kill()
        events = await finished(handle)
        await fake.router.stop()
        return events

    events = run_virtual(main)
    assert "worker 0 died after this request had generated 1 tokens" in events[-1].error


def test_many_requests_on_a_virtual_clock_all_finish_and_leave_no_kv():
    reqs = [Request(i, 0.01 * i, 100 + 37 * i % 900, 1 + 7 * i % 30, SLO(1.0, 0.1)) for i in range(30)]

    async def main(loop):
        policy, workers = build("tropical", workers=3, kv_tokens=6000)
        fake = start_router(loop, policy, workers, {r.id: r.prompt_len for r in reqs})
        handles = []
        for r in reqs:
            await at(loop, r.arrival)
            handles.append(fake.router.submit(submission(r)))
        ends = await asyncio.gather(*(finished(h) for h in handles))
        await at(loop, loop.time() + 1.0)
        await fake.router.stop()
        return fake, handles, ends

    fake, handles, ends = run_virtual(main)
    assert all(e[-1].finish_reason == "length" for e in ends)
    assert [h.completion_tokens for h in handles] == [r.output_len for r in reqs]
    assert all(w.kv.used_blocks == 0 and not w.running and not w.waiting for w in fake.router.workers)
    assert not fake.router.handles and not fake.router.sequences


def migrate_to_a_busy_decoder(log: IterationLog | None = None) -> tuple[FakeCluster, RequestHandle]:
    """Disaggregated: a long decode keeps the decode worker stepping; a 3,000-token prompt
    arrives 50 ms after its first token and migrates there mid-step. ``log`` records the run."""
    busy, newcomer = requests((50, 400), (3000, 6))

    async def main(loop):
        policy, workers = build("disagg")
        fake = start_router(loop, policy, workers, {0: 50, 1: 3000})
        fake.router.iteration_log = log
        first = fake.router.submit(submission(busy))
        await first.events.get()
        await at(loop, loop.time() + 0.05)
        handle = fake.router.submit(submission(newcomer))
        await finished(handle)
        await fake.router.stop()
        return fake, handle

    return run_virtual(main)


def test_a_migrated_request_joins_the_first_iteration_after_its_kv_is_staged():
    """The decode worker is mid-step when the KV is staged; it imports before planning its next
    step, which decodes the newcomer (an import queued behind the step would join one later)."""
    fake, handle = migrate_to_a_busy_decoder()
    staged = handle.req.first_token + handle.req.migration_time
    after = [(now, batch) for worker, now, batch in fake.plans if worker == 1 and now >= staged]
    assert handle.req.decode_worker == 1 and after[0][1].decode_count == 2


def test_blocks_a_kv_import_evicts_leave_the_model_before_the_next_plan():
    """The decode worker's engine makes room for an import by evicting a cached block: the router's
    model of that cache loses it at once, before the worker's next iteration is planned on it
    (a plan counting it cached would start a prompt on KV the engine no longer has)."""
    first, second = requests((64, 2), (32, 2))
    second.arrival = 1.0
    prefix = block_hashes([1] * 64, 16)

    async def main(loop):
        policy = make_policy("disagg")
        workers = linear_cluster(2, 50_000).build(policy, prefix_cache=True)
        fake = start_router(loop, policy, workers, {0: 64, 1: 32})
        fake.workers[1].evicts[second.id] = (prefix[3],)
        handles = await submit_at_arrivals(loop, fake.router, [first, second])
        for handle in handles:
            await finished(handle)
        await fake.router.stop()
        return fake

    cached = run_virtual(main).router.workers[1].kv.cache.entries
    assert prefix[3] not in cached and {prefix[0], prefix[1], prefix[2]} <= cached.keys()


def test_predictive_admission_refuses_live_a_request_whose_decode_would_break_its_tpot():
    """A TPOT SLO of 1 us: any decode iteration breaks it. The router refuses it at submission
    with 429, the reason and a retry hint, before it runs; the next ordinary request is served."""
    hopeless, ordinary = Request(0, 0.0, 50, 5, SLO(10.0, 1e-6)), Request(1, 0.0, 50, 5, SLO(10.0, 0.1))

    async def main(loop):
        policy = make_policy("chunked-512", PolicyParams(admission=AdmissionMode.PREDICTIVE))
        fake = start_router(loop, policy, linear_cluster(1, 50_000).build(policy), {0: 50, 1: 50})
        with pytest.raises(Rejected) as refused:
            fake.router.submit(submission(hopeless))
        events = await finished(fake.router.submit(submission(ordinary)))
        await fake.router.stop()
        return fake, refused.value, events

    fake, refused, events = run_virtual(main)
    assert refused.status == 429 and "TPOT SLO" in refused.reason and refused.retry_after is not None
    assert events[-1].finish_reason == "length"
    assert [r.id for _, _, batch in fake.plans for r, _, _ in batch.prefills] == [1]
    assert fake.router.metrics.rejected.labels("decode_load")._value.get() == 1


def test_a_queued_request_whose_ttft_lapses_is_refused_with_429_before_it_runs():
    """The predictor expects prompt tokens twice as fast as the worker runs them: B, admitted
    behind A (predicted 0.51 s) within its 0.6 s TTFT SLO, can no longer make it once A ends at
    0.76 s."""
    a, b = Request(0, 0.0, 5000, 5, SLO(10.0, 0.1)), Request(1, 0.0, 10, 5, SLO(0.6, 0.1))

    async def main(loop):
        policy = make_policy("colocated", PolicyParams(admission=AdmissionMode.EARLY_REJECT))
        workers = linear_cluster(1, 50_000).build(policy)
        fake = start_router(loop, policy, workers, {0: 5000, 1: 10})
        workers[0].latency = linear_model(prefill_per_token=5e-5)
        handles = [fake.router.submit(submission(r)) for r in (a, b)]
        events = [await finished(h) for h in handles]
        await fake.router.stop()
        return fake, events

    fake, events = run_virtual(main)
    assert events[0][-1].finish_reason == "length"
    refused = events[1][-1]
    assert refused.status == 429 and "can no longer be met" in refused.error
    assert all(r.id != 1 for _, _, batch in fake.plans for r, _, _ in batch.prefills)
    assert fake.router.metrics.rejected.labels("ttft_queued")._value.get() == 1
