"""Migration staging areas: files mapped shared by the worker that writes and the one that reads.

A mapped file (rather than /dev/shm) works wherever the temp directory does, even in containers
with a tiny /dev/shm; the pages stay in the page cache, so a migration is two memory copies.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from tropical.serve.workers.messages import StagingArea

STAGED_CONTEXTS = 2
"""A staging area holds this many full contexts, so the prompts one prefill batch completes
(at most a context plus the batch's token budget, in practice) export at once."""


def create_staging(directory: str, worker_id: int, shape: tuple[int, ...], dtype: torch.dtype) -> StagingArea:
    """Preallocate worker ``worker_id``'s staging file for KV of ``shape``."""
    path = Path(directory) / f"staging-{worker_id}.kv"
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    with path.open("wb") as f:
        f.truncate(size)
    return StagingArea(str(path), tuple(shape), str(dtype).removeprefix("torch."))


def map_staging(area: StagingArea) -> torch.Tensor:
    """The staging area as a tensor backed by the shared file: writes are seen by every mapper."""
    dtype = getattr(torch, area.dtype)
    flat = torch.from_file(area.path, shared=True, size=math.prod(area.shape), dtype=dtype)
    return flat.view(area.shape)


@dataclass(frozen=True, slots=True)
class StagedKV:
    """Where one sequence's exported KV lies: a token range of a staging area."""

    area: StagingArea
    offset: int


class StagingSpace:
    """Which token ranges of a staging area hold exports not yet imported (first fit); an export
    that does not fit waits until an import frees room."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._used: dict[int, int] = {}
        self._freed = asyncio.Condition()

    async def reserve(self, tokens: int) -> int:
        if tokens > self.capacity:
            raise ValueError(f"{tokens} tokens of KV exceed the staging area ({self.capacity} tokens)")
        async with self._freed:
            while (offset := self._first_fit(tokens)) is None:
                await self._freed.wait()
            self._used[offset] = tokens
            return offset

    def _first_fit(self, tokens: int) -> int | None:
        start = 0
        for offset, length in sorted(self._used.items()):
            if offset - start >= tokens:
                return start
            start = offset + length
        return start if self.capacity - start >= tokens else None

    async def release(self, offset: int) -> None:
        async with self._freed:
            del self._used[offset]
            self._freed.notify_all()
