"""A router over fake workers on a virtual clock: its logic runs for real, in no wall time.

``VirtualLoop`` is an asyncio loop whose clock jumps to the next timer whenever nothing is ready,
so sleeps cost nothing and every time the router reads is exact. ``FakeWorker`` answers a step
after the time the latency model gives for it (the simulator's truth), samples token 1 (or what a
script says), and stages KV in the model's transfer time; like a worker process it runs one
command at a time, so a KV import waits for the step in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.core.sampling import SamplingParams
from tropical.engine.kv_events import BlockRemoved, KVEvent
from tropical.sched.batching import Batch
from tropical.sched.policy import Policy
from tropical.sched.worker import WorkerState
from tropical.serve.metrics import ServerMetrics
from tropical.serve.router import Router, RouterSettings
from tropical.serve.streams import RequestHandle, Submission
from tropical.serve.workers.handle import WorkerDied
from tropical.serve.workers.messages import Free, Step, StepDone


class VirtualLoop(asyncio.SelectorEventLoop):
    """Time stands still while callbacks are ready and jumps to the next timer when none are."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._clock_resolution = 1e-12

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        while self._scheduled and self._scheduled[0]._cancelled:
            heapq.heappop(self._scheduled)._scheduled = False
        if not self._ready and self._scheduled:
            self._now = max(self._now, self._scheduled[0]._when)
        super()._run_once()


def run_virtual(main: Callable[[VirtualLoop], Any]) -> Any:
    """Run ``main(loop)`` (a coroutine function) to completion on a fresh virtual loop."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


async def at(loop: asyncio.AbstractEventLoop, when: float) -> None:
    """Sleep until exactly ``when`` (``asyncio.sleep`` would add a rounding of its own)."""
    done = loop.create_future()
    loop.call_at(when, done.set_result, None)
    await done


class StubTokenizer:
    """One character per token; ``eos`` names the end-of-sequence ids."""

    def __init__(self, eos: Sequence[int] = ()) -> None:
        self.eos_token_ids = list(eos)

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


@dataclass
class FakeWorker:
    """A worker process that takes the latency model's time for each step and each KV move."""

    worker_id: int
    latency: LatencyModel
    prompt_lens: dict[int, int]
    tokens: Callable[[int, int], int] = lambda rid, step: 1
    alive: bool = True
    freed: list[int] = field(default_factory=list)
    on_death: Callable[[int], None] = lambda worker_id: None
    on_revive: Callable[[int], None] = lambda worker_id: None
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    evicts: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return 1000 + self.worker_id

    @property
    def node(self) -> str:
        return "local"

    async def call(self, command: Any) -> Any:
        """One command at a time, as a worker process reads its pipe."""
        async with self.busy:
            return await self._run(command)

    async def _run(self, command: Any) -> Any:
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} is dead")
        if isinstance(command, Free):
            self.freed += command.seq_ids
            return None
        assert isinstance(command, Step), command
        self.freed += command.free
        seconds = self._seconds(command)
        await asyncio.sleep(seconds)
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} died in a step")
        return StepDone({s.seq_id: self.tokens(s.seq_id, s.step) for s in command.spec.samples}, seconds)

    def _seconds(self, step: Step) -> float:
        """The simulator's price of this step: its closed form for a decode-only step."""
        spans = step.spec.spans
        decodes = [s for s in spans if s.cached >= self.prompt_lens[s.seq_id]]
        prefills = [(len(s.token_ids), s.cached) for s in spans if s.cached < self.prompt_lens[s.seq_id]]
        context = sum(s.cached + 1 for s in decodes)
        if not prefills:
            intercept, slope = self.latency.decode_line(len(decodes))
            return intercept + slope * context
        return self.latency.iteration_time(BatchShape.of_batch(prefills, len(decodes), context))

    @contextlib.asynccontextmanager
    async def exported(self, seq_id: int, tokens: int, start: int = 0) -> AsyncIterator[int]:
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} is dead")
        await asyncio.sleep(self.latency.transfer_time(tokens))
        yield tokens

    async def import_kv(self, seq_id: int, blob: int, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        """Instant, but only between steps: the move's time is spent staging it (``exported``).
        Reports the blocks ``evicts`` says the request's import pushed out of the cache."""
        async with self.busy:
            evicted = self.evicts.get(seq_id, ())
            return [BlockRemoved(evicted)] if evicted else []

    def kill(self) -> None:
        """The process dies: its calls fail from now on, and the router hears of it."""
        self.alive = False
        self.on_death(self.worker_id)

    def stop(self) -> None:
        self.alive = False


@dataclass
class FakeCluster:
    """A started router over fake workers, with every batch each worker planned."""

    router: Router
    workers: list[FakeWorker]
    plans: list[tuple[int, float, Batch]]


def record_plans(cluster_plan: Callable[[int, float], Batch | None],
                 plans: list[tuple[int, float, Batch]]) -> Callable[[int, float], Batch | None]:
    """Wrap a Cluster's ``plan`` so that each batch it forms is recorded with its worker and time."""
    def plan(worker_id: int, now: float) -> Batch | None:
        batch = cluster_plan(worker_id, now)
        if batch is not None:
            plans.append((worker_id, now, batch))
        return batch
    return plan


def start_router(loop: asyncio.AbstractEventLoop, policy: Policy, workers: Sequence[WorkerState],
                 prompt_lens: dict[int, int], eos: Sequence[int] = (),
                 tokens: Callable[[int, int], int] | None = None) -> FakeCluster:
    fakes = [FakeWorker(w.id, w.latency, prompt_lens, **({"tokens": tokens} if tokens else {}))
             for w in workers]
    router = Router(policy, workers, fakes, StubTokenizer(eos), workers[0].latency,
                    RouterSettings(max_waiting=10**6), ServerMetrics(), clock=loop.time)
    plans: list[tuple[int, float, Batch]] = []
    router.cluster.plan = record_plans(router.cluster.plan, plans)
    router.start()
    return FakeCluster(router, fakes, plans)


def submission(req: Request, stop: Sequence[str] = (), retry: bool = True) -> Submission:
    """What a client would send for ``req``: its lengths and its SLO in ms (exact for an SLO
    made of whole ms)."""
    return Submission([1] * req.prompt_len, req.output_len, SamplingParams(), list(stop), False,
                      round(req.slo.ttft * 1e3, 6), round(req.slo.tpot * 1e3, 6), retry)


async def submit_at_arrivals(loop: asyncio.AbstractEventLoop, router: Router,
                             requests: Sequence[Request]) -> list[RequestHandle]:
    """Submit each request at its arrival time; returns their handles."""
    handles = []
    for req in sorted(requests, key=lambda r: r.arrival):
        await at(loop, req.arrival)
        handles.append(router.submit(submission(req)))
    return handles


async def finished(handle: RequestHandle) -> list[Any]:
    """Every event of ``handle``'s stream, up to the final one."""
    events = [await handle.events.get()]
    while not events[-1].final:
        events.append(await handle.events.get())
    return events
