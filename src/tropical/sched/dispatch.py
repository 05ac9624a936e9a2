"""Load-balancing choices shared by every policy (InFaaS-style: fewest unfinished tokens).

Each choice walks the live workers from the least loaded up (or the lowest bound on their cost)
and stops as soon as no worker further on could win, so that a dispatch over a thousand workers
prices the few at the front (the walk is a heap: building it is one pass of cheap reads, each
step a logarithm). The heap is built from lower bounds of each worker's load (``load_floor``),
which read no decode progress the simulator has not booked yet (``sched.lag``): only the workers
the walk reaches are brought up to date.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence

from tropical.core.request import Request
from tropical.sched.worker import WorkerState


def least_loaded_first(workers: Iterable[WorkerState]) -> Iterator[WorkerState]:
    """The live workers by fewest unfinished tokens (lowest id breaks ties), produced lazily: a
    worker whose floor reaches the front goes back in at its exact load unless that is its floor."""
    heap = [(w.load_floor, w.id, w) for w in workers if w.alive]
    heapq.heapify(heap)
    while heap:
        floor, wid, worker = heap[0]
        exact = worker.unfinished_tokens
        if exact == floor:
            heapq.heappop(heap)
            yield worker
        else:
            heapq.heapreplace(heap, (exact, wid, worker))


def fewest_unfinished(workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work (lowest id breaks ties)."""
    return next(least_loaded_first(workers), None)


def least_work(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """The live worker with the least outstanding work once it took ``req``: its unfinished
    tokens plus the prompt tokens of ``req`` its prefix cache lacks (lowest id breaks ties;
    without a cache, the same choice as ``fewest_unfinished``)."""
    live = [w for w in workers if w.alive]
    floor = new_token_floors(req, live)
    best = cheapest(live, lambda w: w.load_floor + floor(w),
                    lambda w: w.unfinished_tokens + w.prompt_split(req)[0])
    return None if best is None else best[0]


def cheapest(workers: Iterable[WorkerState], bound: Callable[[WorkerState], float],
             cost: Callable[[WorkerState], float]) -> tuple[WorkerState, float] | None:
    """The live worker of least ``cost`` (lowest id breaks ties) and that cost, priced in order of
    ``bound``, which is never above ``cost``: the walk stops once no worker further on could win."""
    heap = [(bound(w), w.id, w) for w in workers if w.alive]
    heapq.heapify(heap)
    best: tuple[float, int] | None = None
    chosen = None
    while heap:
        floor, wid, worker = heapq.heappop(heap)
        if best is not None and (floor, wid) > best:
            break
        key = (cost(worker), wid)
        if best is None or key < best:
            best, chosen = key, worker
    return None if chosen is None or best is None else (chosen, best[0])


def new_token_floors(req: Request, workers: Sequence[WorkerState]) -> Callable[[WorkerState], int]:
    """For each worker, a floor on the prompt tokens of ``req`` it would compute: what the
    request has left where it is, else its prompt past the run of its prefix blocks that the
    worker holds (the fleet's directory says, in one walk of the prompt's blocks), and never
    less than the last token (a hit stops short of it)."""
    left = req.remaining_prompt
    if not req.prefix:
        return lambda w: left
    cache = next((w.kv.cache for w in workers if w.kv.cache is not None), None)
    if cache is None or cache.directory is None:
        return lambda w: min(left, 1)
    runs, span, prompt = cache.directory.runs(req), req.prefix_block, req.prompt_len
    return lambda w: min(left, max(1, prompt - runs.get(w.id, 0) * span))


def first_fitting(workers: Iterable[WorkerState],
                  fits: Callable[[WorkerState], bool]) -> WorkerState | None:
    """The least loaded live worker that ``fits`` (lowest id breaks ties)."""
    for worker in least_loaded_first(workers):
        if fits(worker):
            return worker
    return None


def has_room(req: Request, worker: WorkerState) -> bool:
    """Could ``worker`` decode ``req`` now: it decodes, holds its KV, and has a seat."""
    return worker.role.decodes and worker.can_hold(req) and worker.batch_size < worker.rules.max_seqs


def decode_destination(req: Request, workers: Iterable[WorkerState]) -> WorkerState | None:
    """Where a prefilled request should decode: fewest unfinished tokens among those with room
    (only decoding workers enter the walk: under disaggregation the least loaded are often the
    prefill workers, and the walk would pass each of them)."""
    return first_fitting([w for w in workers if w.role.decodes], lambda w: has_room(req, w))
