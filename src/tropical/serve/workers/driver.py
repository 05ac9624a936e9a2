"""The router's hold on one of our engine's workers: the handle it talks through, the task that runs
the worker's iterations, the wake-up that task sleeps on, and what waits for the worker's next
boundary (requests to drop, KV to free, migrated KV to import).

A worker runs one command at a time, so whatever changes its KV between two iterations is queued
here and carried out by the router before it plans the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tropical.engine.kv_events import KVEvent
from tropical.sched.cluster import Migrate
from tropical.serve.workers.handle import WorkerDied, WorkerHandle
from tropical.serve.workers.messages import Free, Step, StepDone


@dataclass(slots=True)
class Landing:
    """A migration whose KV is staged on its source, waiting for its target's next boundary;
    ``done`` releases the staged copy once the target has imported it (or failed to)."""

    move: Migrate
    blob: object
    staged: float
    exported: float
    done: asyncio.Future

    def release(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class WorkerDriver:
    """One worker as the router drives it (``worker_id`` is its place in the Cluster)."""

    def __init__(self, worker_id: int, client: WorkerHandle) -> None:
        self.worker_id = worker_id
        self.client = client
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._aborts: set[int] = set()
        self._frees: list[int] = []
        self._landings: list[Landing] = []

    def run(self, loop: Coroutine[Any, Any, None]) -> None:
        """Run ``loop`` (the worker's iterations) as its task, in place of the one before it."""
        if self.task is not None:
            self.task.cancel()
        self.task = asyncio.create_task(loop, name=f"drive-{self.worker_id}")

    def wake(self) -> None:
        """New work: start an iteration if the worker idles."""
        self.wakeup.set()

    def abort(self, rid: int) -> None:
        """Drop ``rid`` at the next boundary."""
        self._aborts.add(rid)
        self.wakeup.set()

    def free(self, rid: int) -> None:
        """Free ``rid``'s KV with the next command the worker gets."""
        self._frees.append(rid)

    def receive(self, landing: Landing) -> None:
        """Import migrated KV at the next boundary."""
        self._landings.append(landing)
        self.wakeup.set()

    def take_aborts(self) -> set[int]:
        aborts, self._aborts = self._aborts, set()
        return aborts

    def take_frees(self) -> list[int]:
        frees, self._frees = self._frees, []
        return frees

    def take_landings(self) -> list[Landing]:
        landings, self._landings = self._landings, []
        return landings

    def forget(self) -> None:
        """A restarted worker holds nothing: what was queued for the dead one is void."""
        self._aborts, self._frees = set(), []

    async def step(self, step: Step) -> StepDone:
        """Run one iteration; raises WorkerDied, or WorkerError if the worker could not run it."""
        done: StepDone = await self.client.call(step)
        return done

    async def free_now(self, rids: list[int]) -> None:
        """Free KV while no iteration runs (if the worker died, its requests are handled elsewhere)."""
        with contextlib.suppress(WorkerDied):
            await self.client.call(Free(rids))

    async def export(self, move: Migrate, target: WorkerDriver, clock: Callable[[], float]) -> None:
        """Stage ``move``'s KV here and hand it to ``target``, which imports it at its next
        boundary; the staged copy lives until then. Raises WorkerDied or WorkerError."""
        req = move.request
        start = clock()
        async with self.client.exported(req.id, move.tokens, req.prompt_len - move.tokens) as blob:
            landing = Landing(move, blob, start, clock(), asyncio.get_running_loop().create_future())
            target.receive(landing)
            await landing.done

    async def land(self, landing: Landing) -> list[KVEvent]:
        """Import staged KV after the prefix the target has cached, returning the import's KV
        events; raises WorkerDied or WorkerError."""
        move, req = landing.move, landing.move.request
        return await self.client.import_kv(req.id, landing.blob, move.tokens,
                                           req.prompt_len - move.tokens, req.prefix)
