"""How much prompt one multiplexing iteration carries: the chunk its TPOT limit admits.

Chunked multiplexing feeds queued prompts to a decoding worker in the largest chunk that keeps
each iteration within the tightest TPOT SLO there. The toggle predicts when a prompt finishes
from the room that leaves for prompt compute beside the decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape
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
