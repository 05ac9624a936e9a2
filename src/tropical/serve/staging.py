"""Migration staging areas: files mapped shared by the worker that writes and the one that reads.

A mapped file (rather than /dev/shm) works wherever the temp directory does, even in containers
with a tiny /dev/shm; the pages stay in the page cache, so a migration is two memory copies.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tropical.serve.messages import StagingArea


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
