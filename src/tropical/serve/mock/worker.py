"""A mock worker: the router's WorkerHandle for a worker that sleeps instead of computing.

It lives on the router's event loop (a coroutine, not a process), so hundreds fit on a laptop;
the router still holds one handle, one driver and one WorkerState per worker and cannot tell a
mock from a worker process: it takes the same commands one at a time, answers a step with the
sampled tokens and the seconds it took, and stages KV in the link's transfer time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tropical.core.latency.shape import BatchShape
from tropical.engine.kv_events import KVEvent
from tropical.sched.step import StepSpec
from tropical.serve.mock.model import MockModel
from tropical.serve.workers.handle import WorkerDied, WorkerError
from tropical.serve.workers.messages import Free, Ready, Step, StepDone

Sleep = Callable[[float], Awaitable[None]]


def step_shape(spec: StepSpec) -> BatchShape:
    """The batch shape of a planned step, as the latency model prices it: a span whose row samples
    a request's second or later token is a decode over the context before it, every other span a
    prompt span (sched's ``step_spec`` samples a prompt's first token at step 0)."""
    decoding = {row.seq_id for row in spec.samples if row.step > 0}
    prefills = [(len(s.token_ids), s.cached) for s in spec.spans if s.seq_id not in decoding]
    context = sum(s.total for s in spec.spans if s.seq_id in decoding)
    return BatchShape.of_batch(prefills, len(decoding), context)


class MockWorker:
    """One mock worker; ``sleep`` is how it waits (a test passes one that records)."""

    node = "local"

    def __init__(self, worker_id: int, model: MockModel, sleep: Sleep = asyncio.sleep) -> None:
        self.worker_id = worker_id
        self.model = model
        self.alive = True
        self.on_death: Callable[[int], None] = lambda _: None
        self.on_revive: Callable[[int], None] = lambda _: None
        self._sleep = sleep
        self._busy = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return os.getpid()

    async def ready(self, timeout: float) -> Ready:
        model = self.model
        return Ready(self.worker_id, os.getpid(), model.name, model.config, model.tokenizer, True,
                     model.num_blocks, model.block_size, model.max_model_len, None)

    async def call(self, command: Any) -> Any:
        """Run one command (one at a time, as a worker process reads its pipe)."""
        async with self._busy:
            self._check_alive()
            if isinstance(command, Step):
                return await self._step(command.spec)
            if isinstance(command, Free):
                return None
            raise WorkerError(f"worker {self.worker_id}: the mock engine cannot run "
                              f"{type(command).__name__}")

    async def _step(self, spec: StepSpec) -> StepDone:
        """Sleep the step's predicted time; its compute time is what the sleep took on the loop's
        clock (the one the router reads)."""
        clock = asyncio.get_running_loop().time
        start = clock()
        await self._sleep(self.model.latency.iteration_time(step_shape(spec)))
        return StepDone(self.model.tokens(spec.samples), clock() - start)

    @contextlib.asynccontextmanager
    async def exported(self, seq_id: int, tokens: int, start: int = 0) -> AsyncIterator[int]:
        """Staging the KV takes the link's transfer time for ``tokens``; the blob is their count."""
        if tokens:
            async with self._busy:
                self._check_alive()
                await self._sleep(self.model.latency.transfer_time(tokens))
        yield tokens

    async def import_kv(self, seq_id: int, blob: Any, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        """Instant, but only between steps (the move's time was spent staging it); a mock keeps no
        cache, so it reports no KV events."""
        async with self._busy:
            self._check_alive()
        return []

    def _check_alive(self) -> None:
        if not self.alive:
            raise WorkerDied(f"worker {self.worker_id} is not running")

    def stop(self) -> None:
        self.alive = False
