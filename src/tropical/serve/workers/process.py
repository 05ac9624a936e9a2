"""A worker process: one model, one paged KV cache, commands from the router one at a time.

The process holds no scheduling state: the router plans every step (sched's batch formation on
its copy of this worker's state) and this side executes it. A command that fails is answered
with its error and the process goes on; only a broken pipe ends it.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from tropical.engine.executor import Executor
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.kv_events import KVEvent
from tropical.engine.loader import load_model
from tropical.engine.profiler import GRIDS, profile_document, profile_engine
from tropical.serve.workers.messages import (
    Export,
    Free,
    Import,
    Profile,
    Ready,
    Reply,
    StagingArea,
    Step,
    StepDone,
    WorkerLaunch,
)
from tropical.serve.workers.staging import STAGED_CONTEXTS, create_staging, map_staging


class WorkerRuntime:
    """The executor plus this worker's staging area and the peers' areas it has mapped (when
    the backend migrates KV through staging files; the Ray backend moves tensors itself)."""

    def __init__(self, launch: WorkerLaunch) -> None:
        torch.set_num_threads(launch.threads)
        dtype = getattr(torch, launch.dtype)
        self.loaded = load_model(launch.model, dtype=dtype, device=launch.device)
        config = self.loaded.config
        self.max_model_len = min(launch.max_model_len, config.max_position_embeddings)
        blocks = -(-launch.kv_tokens // launch.block_size)
        cache = PagedKVCache(config, blocks, launch.block_size, dtype, launch.device)
        self.executor = Executor(self.loaded.model, cache)
        staged = STAGED_CONTEXTS * self.max_model_len
        shape = (config.num_hidden_layers, 2, staged, config.num_key_value_heads, config.head_dim)
        self.area = None if launch.staging_dir is None else create_staging(
            launch.staging_dir, launch.worker_id, shape, dtype)
        self.staging = None if self.area is None else map_staging(self.area)
        self.peers: dict[str, torch.Tensor] = {}
        self.launch = launch

    def ready(self) -> Ready:
        cache = self.executor.cache
        return Ready(self.launch.worker_id, os.getpid(), self.loaded.name, self.loaded.config,
                     self.loaded.tokenizer, self.loaded.chat, cache.num_blocks, cache.block_size,
                     self.max_model_len, self.area)

    def handle(self, command: Any) -> Any:
        if isinstance(command, Step):
            self.executor.free(command.free)
            start = time.perf_counter()
            out = self.executor.run(command.spec)
            return StepDone(out.tokens, time.perf_counter() - start, self.executor.cache.take_events(),
                            out.logprobs, out.prompt_logprobs)
        if isinstance(command, Free):
            self.executor.free(command.seq_ids)
            return None
        if isinstance(command, Export):
            return self._timed(self._export, command)
        if isinstance(command, Import):
            return self._import(command)
        if isinstance(command, Profile):
            return self._profile(command.grid)
        raise TypeError(f"unknown command {type(command).__name__}")

    @staticmethod
    def _timed(action: Any, command: Any) -> float:
        start = time.perf_counter()
        action(command)
        return time.perf_counter() - start

    def export_kv(self, seq_id: int, tokens: int, start: int = 0) -> torch.Tensor:
        """A copy [layers, 2, tokens, kv_heads, head_dim] of a sequence's ``tokens`` tokens of KV
        from ``start`` on, for a backend that moves it between workers itself."""
        return self.executor.cache.export(seq_id, tokens, start)

    def import_kv(self, seq_id: int, kv: torch.Tensor, start: int = 0,
                  block_hashes: tuple[int, ...] = ()) -> list[KVEvent]:
        """Write the KV in, and say what the cache stored and evicted to make room: the router's
        model of this cache must lose those blocks before it plans the next step here."""
        self.executor.cache.import_(seq_id, kv, start, block_hashes)
        return self.executor.cache.take_events()

    def _export(self, command: Export) -> None:
        if self.staging is None:
            raise RuntimeError("this worker has no staging area; its backend moves KV with export_kv")
        end = command.offset + command.tokens
        self.staging[:, :, command.offset:end] = self.export_kv(command.seq_id, command.tokens, command.start)

    def _import(self, command: Import) -> list[KVEvent]:
        source = self._peer(command.source)
        return self.import_kv(command.seq_id, source[:, :, command.offset:command.offset + command.tokens],
                              command.start, command.block_hashes)

    def _peer(self, area: StagingArea) -> torch.Tensor:
        if area.path not in self.peers:
            self.peers[area.path] = map_staging(area)
        return self.peers[area.path]

    def _profile(self, grid: str) -> dict:
        return profile_document(profile_engine(self.loaded.model, self.executor.cache, GRIDS[grid]))


def worker_main(conn: Connection, launch: WorkerLaunch) -> None:
    """Process entry point: load, say Ready (or why not), then serve commands until the pipe closes."""
    try:
        runtime = WorkerRuntime(launch)
    except Exception as exc:  # noqa: BLE001 - any start-up failure is reported to the router
        conn.send(Reply(error=f"worker {launch.worker_id} failed to start: {exc}"))
        return
    conn.send(Reply(runtime.ready()))
    while True:
        try:
            command = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(Reply(runtime.handle(command)))
        except Exception as exc:  # noqa: BLE001 - a failed command must not kill the worker
            conn.send(Reply(error=f"{type(exc).__name__}: {exc}"))
