"""The router's handle on one worker actor: calls awaited on the event loop, KV through the object
store, and a watcher that notices a death, or a restart, even while the router sends nothing.

Ray fails every call pending on an actor that dies (ActorDiedError, or ActorUnavailableError
while it restarts), so a busy worker's death surfaces in the call the router is awaiting. An idle
worker's surfaces in the watcher's next ping. With ``max_restarts`` Ray re-creates the actor; a
ping that answers with a new incarnation brings the worker back into service (``on_revive``),
its KV cache empty. Until then, every call names the incarnation it is meant for, so one sent
after a death the router has not yet seen fails as that death instead of running on the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayError, RayTaskError

from tropical.engine.kv_events import KVEvent
from tropical.serve.ray.worker import Location, Restarted
from tropical.serve.workers.handle import WorkerDied, WorkerError
from tropical.serve.workers.messages import Ready

PING_INTERVAL_S = 1.0


class RayWorkerHandle:
    """One worker actor: the Ray backend's WorkerHandle."""

    def __init__(self, actor: ActorHandle, worker_id: int) -> None:
        self.actor = actor
        self.worker_id = worker_id
        self.alive = True
        self.on_death: Callable[[int], None] = lambda _: None
        self.on_revive: Callable[[int], None] = lambda _: None
        self.location: Location | None = None
        self._watcher: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return None if self.location is None else self.location.pid

    @property
    def node(self) -> str:
        return "unplaced" if self.location is None else self.location.node

    async def ready(self, timeout: float) -> Ready:
        """Wait until Ray has placed the actor and it has loaded its model; then start watching."""
        try:
            ready = await asyncio.wait_for(self._start(), timeout)
        except asyncio.TimeoutError:
            raise WorkerError(f"worker {self.worker_id} did not start within {timeout:.0f}s; "
                              f"`ray status` shows whether the cluster can place it") from None
        except RayError as exc:
            raise WorkerError(f"worker {self.worker_id} failed to start: {_summary(exc)}") from None
        self._watcher = asyncio.create_task(self._watch(), name=f"watch-worker-{self.worker_id}")
        return ready

    async def _start(self) -> Ready:
        ready = await self.actor.ready.remote()
        self.location = await self.actor.where.remote()
        return ready

    async def call(self, command: Any) -> Any:
        return await self._result(self._submit("handle", command))

    @contextlib.asynccontextmanager
    async def exported(self, seq_id: int, tokens: int, start: int = 0) -> AsyncIterator[ray.ObjectRef]:
        """The KV's ObjectRef; Ray resolves it inside the importing actor, and frees the object
        once the context has dropped it."""
        seconds, kv = self._submit("export_kv", seq_id, tokens, start)
        await self._result(seconds)
        yield kv

    async def import_kv(self, seq_id: int, blob: ray.ObjectRef, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        return await self._result(self._submit("import_kv", seq_id, blob, start, block_hashes))

    def _submit(self, method: str, *args: Any) -> Any:
        """Send a call to the incarnation the router knows (never to a restart it has not seen)."""
        if not self.alive or self.location is None:
            raise WorkerDied(f"worker {self.worker_id} is not running")
        return getattr(self.actor, method).remote(self.location.incarnation, *args)

    async def _result(self, ref: ray.ObjectRef) -> Any:
        """A call's value; WorkerDied if the actor it was meant for died meanwhile (or before: the
        call reached its restart), WorkerError if the call failed."""
        sent_to = self.location
        try:
            return await ref
        except RayError as exc:
            if not isinstance(exc, RayActorError) and not _restarted(exc):
                raise WorkerError(f"worker {self.worker_id}: {_summary(exc)}") from exc
            if self.location == sent_to:
                self._died()
            raise WorkerDied(f"worker {self.worker_id} (pid {self.pid}) died: {_summary(exc)}") from exc

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL_S)
            try:
                where = await self.actor.where.remote()
            except RayError:
                self._died()
                continue
            if where != self.location:
                self._died()
                self._revived(where)
            elif not self.alive:
                # It answered after a call gave up on it (ActorUnavailableError): its cache may
                # hold what the router has forgotten, so restart it to match the router's view.
                ray.kill(self.actor, no_restart=False)

    def _died(self) -> None:
        if self.alive:
            self.alive = False
            self.on_death(self.worker_id)

    def _revived(self, where: Location) -> None:
        self.location = where
        self.alive = True
        self.on_revive(self.worker_id)

    def stop(self) -> None:
        """Kill the actor for good (no restart)."""
        self.alive = False
        if self._watcher is not None:
            self._watcher.cancel()
        ray.kill(self.actor, no_restart=True)


def _restarted(exc: RayError) -> bool:
    """The call reached a restart of the actor it was meant for."""
    return isinstance(exc, RayTaskError) and isinstance(exc.cause, Restarted)


def _summary(exc: RayError) -> str:
    """The cause of a failed call in one line (Ray's own messages run to many)."""
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__
