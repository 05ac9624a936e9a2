"""Load-balancing choices shared by every policy (InFaaS-style: fewest unfinished tokens).

Each choice walks the live workers from the least loaded up and stops as soon as no worker
further on could win, so that a dispatch over a thousand workers examines the few at the front
(the walk is a heap: building it is one pass of cheap reads, each step a logarithm).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator

from tropical.core.request import Request
from tropical.sched.worker import WorkerState


def least_loaded_first(workers: Iterable[WorkerState]) -> Iterator[WorkerState]:
    """The live workers by fewest unfinished tokens (lowest id breaks ties), produced lazily."""
    heap = [(w.unfinished_tokens, w.id, w) for w in workers if w.alive]
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)[2]


def fewest_unfinished(workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work (lowest id breaks ties)."""
    live = [w for w in workers if w.alive]
    return min(live, key=lambda w: (w.unfinished_tokens, w.id)) if live else None


def least_work(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work once it took ``req``: its unfinished
    tokens plus the prompt tokens of ``req`` its prefix cache lacks (lowest id breaks ties;
    without a cache, the same choice as ``fewest_unfinished``). A worker lacks at least the
    prompt's last token (a hit stops short of it) or, without prefix blocks, all it has left,
    so the walk by load stops once a worker's load plus that floor cannot beat the best found."""
    floor = min(req.remaining_prompt, 1) if req.prefix else req.remaining_prompt
    best: tuple[int, int] | None = None
    chosen = None
    for worker in least_loaded_first(workers):
        if best is not None and (worker.unfinished_tokens + floor, worker.id) > best:
            break
        key = (worker.unfinished_tokens + worker.prompt_split(req)[0], worker.id)
        if best is None or key < best:
            best, chosen = key, worker
    return chosen


def first_fitting(workers: Iterable[WorkerState],
                  fits: Callable[[WorkerState], bool]) -> WorkerState | None:
    """The least loaded live worker that ``fits`` (lowest id breaks ties)."""
    return next((w for w in least_loaded_first(workers) if fits(w)), None)


def has_room(req: Request, worker: WorkerState) -> bool:
    """Could ``worker`` decode ``req`` now: it decodes, holds its KV, and has a seat."""
    return worker.role.decodes and worker.can_hold(req) and worker.batch_size < worker.rules.max_seqs


def decode_destination(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """Where a prefilled request should decode: fewest unfinished tokens among those with room."""
    return first_fitting(workers, lambda w: has_room(req, w))
