"""The router's handle on one worker process: start it, send it commands, notice when it dies.

Replies are read by the event loop when the pipe becomes readable, so the router never blocks on
a busy worker. One command is in flight per worker at a time (a lock), which also keeps a large
send from stalling the loop: the worker is always waiting in ``recv`` when we write.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from tropical.engine.kv_events import KVEvent
from tropical.serve.workers.handle import WorkerDied, WorkerError, WorkerHandle
from tropical.serve.workers.messages import Export, Import, Ready, Reply, StagingArea, WorkerLaunch
from tropical.serve.workers.placement import Placement
from tropical.serve.workers.process import worker_main
from tropical.serve.workers.staging import StagedKV, StagingSpace


class WorkerClient:
    """One worker process and its pipe: the local backend's WorkerHandle."""

    node = "local"

    def __init__(self, launch: WorkerLaunch) -> None:
        self.launch = launch
        self.worker_id = launch.worker_id
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, launch),
                                       name=f"tropical-worker-{launch.worker_id}", daemon=True)
        self.process.start()
        child.close()
        self.alive = True
        self.on_death: Callable[[int], None] = lambda _: None
        self.on_revive: Callable[[int], None] = lambda _: None
        self._pending: asyncio.Future | None = None
        self._lock = asyncio.Lock()
        self._staging: StagingArea | None = None
        self._space = StagingSpace(0)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    async def ready(self, timeout: float) -> Ready:
        """Wait for the worker's Ready, then start listening for replies."""
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self.conn.poll, timeout):
            raise WorkerError(f"worker {self.worker_id} did not start within {timeout:.0f}s")
        reply = self._receive()
        if reply.error is not None:
            raise WorkerError(reply.error)
        loop.add_reader(self.conn.fileno(), self._on_readable)
        self._staging = reply.value.staging
        self._space = StagingSpace(self._staging.shape[2])
        return reply.value

    @contextlib.asynccontextmanager
    async def exported(self, seq_id: int, tokens: int, start: int = 0) -> AsyncIterator[StagedKV]:
        """The KV lands in a range of this worker's staging file, kept until the importer is done;
        several exports may wait for their imports at once (none is staged when the target has
        every token cached)."""
        staging = self._staging
        if staging is None:
            raise RuntimeError(f"worker {self.worker_id} cannot export KV before it is ready")
        if tokens == 0:
            yield StagedKV(staging, 0)
            return
        offset = await self._space.reserve(tokens)
        try:
            await self.call(Export(seq_id, tokens, offset, start))
            yield StagedKV(staging, offset)
        finally:
            await self._space.release(offset)

    async def import_kv(self, seq_id: int, blob: StagedKV, tokens: int, start: int = 0,
                        block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        return await self.call(Import(seq_id, blob.area, tokens, blob.offset, start, block_hashes))

    def _receive(self) -> Reply:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            code = self.process.exitcode
            raise WorkerDied(f"worker {self.worker_id} exited (code {code})") from exc

    async def call(self, command: Any) -> Any:
        """Send ``command`` and wait for its reply's value."""
        async with self._lock:
            if not self.alive:
                raise WorkerDied(f"worker {self.worker_id} is not running")
            self._pending = asyncio.get_running_loop().create_future()
            try:
                self.conn.send(command)
            except (OSError, ValueError) as exc:
                self._died(exc)
            reply: Reply = await self._pending
        if reply.error is not None:
            raise WorkerError(f"worker {self.worker_id}: {reply.error}")
        return reply.value

    def _on_readable(self) -> None:
        try:
            reply = self._receive()
        except WorkerDied as exc:
            self._died(exc)
            return
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(reply)

    def _died(self, cause: BaseException) -> None:
        if not self.alive:
            return
        self.alive = False
        asyncio.get_running_loop().remove_reader(self.conn.fileno())
        error = cause if isinstance(cause, WorkerDied) else WorkerDied(f"worker {self.worker_id}: {cause}")
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(error)
        self.on_death(self.worker_id)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the pipe (the worker exits when it sees EOF); kill it if it lingers."""
        if self.alive:
            self.alive = False
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self.conn.fileno())
        self.conn.close()
        self.process.join(timeout)
        if self.process.is_alive() and self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.join(timeout)


class LocalBackend:
    """Worker processes on this machine, migrating KV through staging files in a temp directory."""

    def __init__(self) -> None:
        self.staging_dir = tempfile.mkdtemp(prefix="tropical-serve-")

    def spawn(self, launches: Sequence[WorkerLaunch], placements: Sequence[Placement]) -> list[WorkerHandle]:
        """Every worker runs here, so there is nothing to place (options reject pins)."""
        return [WorkerClient(replace(launch, staging_dir=self.staging_dir)) for launch in launches]

    def close(self) -> None:
        shutil.rmtree(self.staging_dir, ignore_errors=True)
