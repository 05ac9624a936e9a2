"""The router over fake workers: a failing step, a driver bug, a stalled migration, a death and a
drain each end only the requests they touch, with a clear error, and the router keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tests.factories import linear_model
from tests.live_server import until
from tropical.core.sampling import SamplingParams
from tropical.engine.kv_events import KVEvent
from tropical.sched.registry import make_policy
from tropical.sched.worker import worker_state
from tropical.serve.metrics import ServerMetrics
from tropical.serve.router import Router, RouterSettings
from tropical.serve.streams import Event, RequestHandle, Submission
from tropical.serve.workers.handle import WorkerDied, WorkerError
from tropical.serve.workers.messages import Free, Step, StepDone

POISON = 666
"""A seed the fake worker refuses to sample, standing in for any step that raises in a worker."""


class FakeTokenizer:
    eos_token_ids: list[int] = []

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


class FakeWorker:
    """A WorkerHandle that samples token 7 for every row, after ``delay`` seconds."""

    node = "local"
    pid = None

    def __init__(self, worker_id: int, delay: float = 0.0) -> None:
        self.worker_id, self.delay, self.alive = worker_id, delay, True
        self.on_death: Callable[[int], None] = lambda _: None
        self.on_revive: Callable[[int], None] = lambda _: None
        self.freed: list[int] = []

    async def call(self, command: Any) -> Any:
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} is not running")
        if isinstance(command, Free):
            self.freed += command.seq_ids
            return None
        assert isinstance(command, Step)
        self.freed += command.free
        await asyncio.sleep(self.delay)
        if any(s.params.seed == POISON for s in command.spec.samples):
            raise WorkerError(f"worker {self.worker_id}: RuntimeError: injected fault")
        return StepDone({s.seq_id: 7 for s in command.spec.samples}, self.delay)

    @contextlib.asynccontextmanager
    async def exported(self, seq_id: int, tokens: int, start: int = 0) -> AsyncIterator[None]:
        yield None

    async def import_kv(self, seq_id: int, blob: Any, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        return []

    def die(self) -> None:
        self.alive = False
        self.on_death(self.worker_id)


def make_router(policy: str, kv_blocks: tuple[int, ...], delay: float = 0.0
                ) -> tuple[Router, list[FakeWorker]]:
    chosen = make_policy(policy)
    roles = chosen.roles(len(kv_blocks))
    workers = [worker_state(i, role, chosen.rules(role), blocks, 16, linear_model())
               for i, (role, blocks) in enumerate(zip(roles, kv_blocks, strict=True))]
    fakes = [FakeWorker(i, delay) for i in range(len(workers))]
    router = Router(chosen, workers, fakes, FakeTokenizer(), linear_model(), RouterSettings(max_context=4096),
                    ServerMetrics())
    router.start()
    return router, fakes


def submit(router: Router, max_tokens: int = 4, prompt: int = 8, seed: int | None = None) -> RequestHandle:
    params = SamplingParams(temperature=1.0 if seed is not None else 0.0, seed=seed)
    return router.submit(Submission(list(range(1, prompt + 1)), max_tokens, params, [], ignore_eos=True))


async def final(handle: RequestHandle, timeout: float = 5.0) -> Event:
    async def last() -> Event:
        event = await handle.events.get()
        while not event.final:
            event = await handle.events.get()
        return event
    return await asyncio.wait_for(last(), timeout)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def test_a_step_that_raises_fails_its_requests_and_the_next_request_is_served() -> None:
    async def body() -> None:
        router, fakes = make_router("colocated", (64,))
        failed = await final(submit(router, seed=POISON))
        assert failed.status == 500 and "injected fault" in (failed.error or "")
        served = await final(submit(router, max_tokens=3))
        assert served.finish_reason == "length" and served.error is None
        assert not router.handles and router.workers[0].kv.used_blocks == 0
        await router.stop()
    run(body)


def test_only_the_requests_in_the_failing_step_end() -> None:
    async def body() -> None:
        router, fakes = make_router("colocated", (64, 64), delay=0.01)
        healthy, poisoned = submit(router, max_tokens=20), submit(router, seed=POISON)
        assert router.cluster.where(healthy.req.id) != router.cluster.where(poisoned.req.id), "one per worker"
        assert (await final(poisoned)).error is not None
        assert (await final(healthy)).finish_reason == "length"
        await router.stop()
    run(body)


def test_a_driver_bug_fails_the_workers_requests_and_the_driver_survives() -> None:
    async def body() -> None:
        router, _ = make_router("colocated", (64,))
        cluster = router.cluster
        book = cluster.book

        def broken(*args: Any, **kwargs: Any) -> Any:
            cluster.book = book
            raise KeyError("a bug in booking")
        cluster.book = broken
        failed = await final(submit(router))
        assert failed.status == 500 and "internal error" in (failed.error or "")
        assert (await final(submit(router))).finish_reason == "length"
        await router.stop()
    run(body)


def test_an_abort_on_the_decoding_worker_wakes_a_migration_waiting_for_room() -> None:
    async def body() -> None:
        # The decode worker holds 4 blocks of 16 tokens: the first request (8 + 40 tokens) fills 3,
        # the second (8 + 10) needs 2. At 0.15 s a step the first would decode for 6 s, past the
        # second's 5 s to finish: only the abort frees room in time.
        router, _ = make_router("disagg", (64, 4), delay=0.15)
        first = submit(router, max_tokens=40)
        await asyncio.wait_for(first.events.get(), 5)
        second = submit(router, max_tokens=10)
        await asyncio.wait_for(second.events.get(), 5)
        assert await until(lambda: bool(router.cluster.stalled), timeout=5), \
            "the second request waits for room on the decoding worker"
        router.abort(first.req.id)
        assert (await final(second)).finish_reason == "length"
        await router.stop()
    run(body)


async def died_mid_stream() -> tuple[Router, RequestHandle]:
    """A router whose one worker dies after streaming a request's first token."""
    router, fakes = make_router("colocated", (64,), delay=0.01)
    handle = submit(router, max_tokens=200)
    await asyncio.wait_for(handle.events.get(), 5)
    fakes[0].die()
    return router, handle


def test_a_request_whose_worker_dies_after_its_first_token_fails_with_503() -> None:
    async def body() -> None:
        router, handle = await died_mid_stream()
        failed = await final(handle)
        assert failed.status == 503 and "generated" in (failed.error or "")
        assert router.unavailable is not None and "no live worker" in router.unavailable
        await router.stop()
    run(body)


def test_a_dead_worker_shows_no_load_though_its_last_state_held_a_request() -> None:
    async def body() -> None:
        router, handle = await died_mid_stream()
        await final(handle)
        assert router.workers[0].running, "the dead worker's last state still lists its request"
        labels = {"worker": "0", "role": router.workers[0].role.value, "node": "local"}
        gauges = ("tropical_worker_up", "tropical_worker_running", "tropical_worker_waiting",
                  "tropical_worker_kv_usage")
        assert [router.metrics.registry.get_sample_value(g, labels) for g in gauges] == [0, 0, 0, 0]
        await router.stop()
    run(body)


def test_losing_the_only_decoding_worker_makes_the_router_unavailable() -> None:
    async def body() -> None:
        router, fakes = make_router("disagg", (64, 64))
        assert router.unavailable is None
        fakes[1].die()
        assert "decodes" in (router.unavailable or "")
        await router.stop()
    run(body)


def test_drain_ends_what_outlives_its_timeout_with_an_error() -> None:
    async def body() -> None:
        router, fakes = make_router("colocated", (64,), delay=0.01)
        handle = submit(router, max_tokens=1000)
        await router.drain(0.05)
        failed = await final(handle)
        assert failed.status == 503 and "shutting down" in (failed.error or "")
        assert router.unavailable is not None and "shutting down" in router.unavailable
        freed = await until(lambda: handle.req.id in fakes[0].freed, timeout=5)
        assert freed, "its KV is freed at the step boundary"
        assert not router.cluster.on_worker(0) and router.workers[0].kv.used_blocks == 0
        await router.stop()
    run(body)
