"""Chunked multiplexing's predictions: how much prompt an iteration carries, when a prompt's
first token comes, and where a prompt goes in a multiplexing worker's queue.

Chunked multiplexing feeds queued prompts to a decoding worker in the largest chunk that keeps
each iteration within the tightest TPOT SLO there. Chunks shrink as a prompt's cached context
grows, so the toggle counts iterations by prompt compute (attention over the whole context
included), not by tokens. Under laxity order a prompt goes ahead of queued prompts with more
TTFT slack, which then finish later: the toggle checks that none it could still save is lost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.pending import Pending
from tropical.sched.slack import largest_chunk
from tropical.sched.worker import WorkerState


@dataclass(frozen=True, slots=True)
class Chunk:
    """One multiplexing iteration at its limit: ``tokens`` fresh prompt tokens beside the
    decodes, its time, the prompt compute it has room for (its time less the decodes'), and
    the fixed cost of a prompt chunk (a one-token chunk's compute)."""

    tokens: int
    iteration: float
    room: float
    overhead: float

    @classmethod
    def of(cls, worker: WorkerState, decode: BatchShape, limit: float) -> Chunk:
        """The largest chunk beside ``decode`` within ``limit`` seconds (zero tokens if none)."""
        def time_of(n: int) -> float:
            return worker.latency.iteration_time(decode.plus_prefill(n, 0))

        tokens = largest_chunk(worker.rules.token_budget - decode.decode_count, time_of, limit)
        if tokens == 0:
            return cls(0, 0.0, 0.0, 0.0)
        base = worker.latency.iteration_time(decode)
        iteration = time_of(tokens)
        overhead = time_of(1) - base
        return cls(tokens, iteration, max(iteration - base - overhead, 1e-9), overhead)

    def finish(self, worker: WorkerState, prompts: Pending, start: float) -> float:
        """End of the iteration that completes ``prompts`` fed in these chunks from ``start``:
        their compute as whole spans (chunking adds only a fixed cost per chunk) over the room
        each iteration has, and never fewer iterations than their tokens need."""
        work = worker.latency.iteration_time(prompts.shape) - self.overhead
        steps = max(math.ceil(prompts.tokens / self.tokens), math.ceil(work / self.room))
        return start + steps * self.iteration - max(0.0, steps * self.room - work)


def place(worker: WorkerState, queue: Sequence[Request], req: Request,
          laxity: bool) -> tuple[list[Request], list[Request]]:
    """The prompts of ``queue`` that ``req`` would wait for, and those it would go ahead of
    (least slack first under laxity order, at the back otherwise), each in queue order."""
    if not laxity:
        return list(queue), []
    key = worker.latest_start(req)
    ahead, behind = [], []
    for other in queue:
        (ahead if worker.latest_start(other) <= key else behind).append(other)
    behind.sort(key=worker.latest_start)
    return ahead, behind


def keeps_promises(worker: WorkerState, chunk: Chunk, start: float, before: Pending,
                   req: Request, behind: Sequence[Request]) -> bool:
    """Would every prompt of ``behind`` that meets its TTFT SLO after the prompts of ``before``
    still meet it with ``req`` run ahead of it?"""
    after = before.plus(req, worker)
    for other in behind:
        before, after = before.plus(other, worker), after.plus(other, worker)
        deadline = other.arrival + other.slo.ttft
        if chunk.finish(worker, after, start) > deadline >= chunk.finish(worker, before, start):
            return False
    return True
