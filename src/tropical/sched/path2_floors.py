"""Floors on when chunked multiplexing would finish a prompt, so that Path 2 prices only the
multiplexing workers that could win.

Chunked multiplexing finishes a prompt on a worker at (``Chunk.finish``)

    start + loads + W + s * b + (s - 1) * o

where W is the prefill-only time of the prompts it waits for and its own, b the decode batch's
iteration alone, o a chunk's fixed cost (never negative under a monotone model) and s the
iterations it takes: at least W / (L - b) for a limit L on each iteration, and at least its new
tokens over the tokens an iteration carries. Each term has a floor read without pricing the
worker's next iteration, its lineup or its chunk: the start is when its iteration in flight ends
(as booked), W is at least the prompt alone with the most of it the worker's cache could hold
(``NewTokenFloors``: one price per count of new tokens), b is at least the running batch as
booked (its contexts only grow), L is at most the request's own TPOT SLO, and an iteration
carries at most the token budget less one token per decode. A thousand-worker fleet's Path 2
shortlist then prices the few whose floors reach below the best price found, not all of them.
The floors hold only for latency models whose predictions grow with the batch (``monotone``);
for others there are none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.request import Request
from tropical.sched.dispatch import NewTokenFloors
from tropical.sched.worker import WorkerState

ROUNDING_S = 1e-9
"""How far under its sum a floor is set: ``Chunk.finish`` adds the same terms in another order,
and the two may round apart by an ulp (found at 64 workers: a floor one ulp above its price)."""


def chunked_floors(req: Request, workers: Sequence[WorkerState],
                   now: float) -> Callable[[WorkerState], float] | None:
    """For each of ``workers`` (multiplexing), a floor on when chunked multiplexing would finish
    ``req``'s prompt there; None if some worker's latency model is not monotone."""
    if not all(w.latency.monotone for w in workers):
        return None
    floors = NewTokenFloors.of(req, workers)
    priced: dict[tuple[int, int], float] = {}
    limit = req.slo.tpot

    def floor(worker: WorkerState) -> float:
        new = floors.at(worker)
        key = (new, id(worker.latency))
        work = priced.get(key)
        if work is None:
            work = priced[key] = prefill_time(worker.latency, new, req.prompt_len - new)
        batch = len(worker.running)
        decode = decode_time(worker.latency, batch, worker.decode_context_floor) if batch else 0.0
        steps = 1 if limit - decode <= 0 else max(1, math.ceil(work / (limit - decode)))
        per_iteration = worker.rules.token_budget - batch
        if per_iteration > 0:
            steps = max(steps, -(-new // per_iteration))
        return max(now, worker.booked_busy_until()) + work + steps * decode - ROUNDING_S
    return floor
