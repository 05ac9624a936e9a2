"""One engine worker in one process: a StepPlanner in front of an Executor.

Each step is schedule (sched's ``form_batch``, the same code the simulator runs), run (one forward
over the batch's spans, then sampling), post-process (book progress on the WorkerState exactly as
the simulator does, free finished requests' KV). The WorkerState's KVPool mirrors the engine cache
block for block, so a batch the scheduler admits always fits the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.engine.executor import Executor
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.planner import FinishedRequest, Sequence, StepPlanner
from tropical.engine.sampling import SamplingParams
from tropical.sched.kv import KVPool
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState

# The engine measures time instead of predicting it; the WorkerState only prices work for the TPOT
# guard and for prefill-only workers, so a colocated engine without a profile runs unpriced.
UNPRICED = FittedModel(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, transfer_bandwidth=1.0)


@dataclass(frozen=True, slots=True)
class IterationReport:
    """What one step did and what the worker holds after it."""

    duration: float
    shape: BatchShape
    prefill_tokens: int
    decode_count: int
    kv_blocks_used: int
    kv_blocks_total: int
    waiting: int
    running: int
    finished: list[FinishedRequest]


def worker_state(worker_id: int, role: Role, rules: BatchRules, cache_blocks: int, block_size: int,
                 latency: LatencyModel = UNPRICED) -> WorkerState:
    """A WorkerState whose KV pool mirrors an engine cache of ``cache_blocks`` blocks."""
    pool = KVPool(capacity_blocks=cache_blocks, block_size=block_size)
    return WorkerState(worker_id, role, rules, pool, latency)


class EngineWorker:
    """A model, its paged cache and the scheduler state that decides each batch."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, rules: BatchRules | None = None,
                 latency: LatencyModel = UNPRICED, eos_ids: frozenset[int] = frozenset(),
                 worker_id: int = 0) -> None:
        self.executor = Executor(model, cache)
        state = worker_state(worker_id, Role.COLOCATED, rules or BatchRules(), cache.num_blocks,
                             cache.block_size, latency)
        self.planner = StepPlanner(state, eos_ids)

    @property
    def state(self) -> WorkerState:
        return self.planner.state

    @property
    def cache(self) -> PagedKVCache:
        return self.executor.cache

    @property
    def has_work(self) -> bool:
        return self.planner.has_work

    def submit(self, req: Request, prompt_ids: list[int], sampling: SamplingParams) -> None:
        """Queue ``req``; its ``output_len`` is the max tokens to generate."""
        self.planner.add(Sequence(req, list(prompt_ids), sampling))
        self.state.enqueue(req)

    def step(self, now: float) -> IterationReport:
        """Form, run and book one iteration that starts at ``now`` (seconds on the caller's clock)."""
        planned = self.planner.plan(now)
        start = time.perf_counter()
        tokens = self.executor.run(planned.spec) if planned is not None else {}
        duration = time.perf_counter() - start
        finished = self.planner.book(planned, tokens, now + duration).finished if planned else []
        self.executor.free(f.req.id for f in finished)
        batch = planned.batch if planned else None
        return IterationReport(
            duration=duration,
            shape=batch.shape if batch else BatchShape.of_batch([], 0, 0),
            prefill_tokens=sum(new for _, new, _ in batch.prefills) if batch else 0,
            decode_count=batch.decode_count if batch else 0,
            kv_blocks_used=self.cache.used_blocks,
            kv_blocks_total=self.cache.num_blocks,
            waiting=len(self.state.waiting),
            running=len(self.state.running),
            finished=finished,
        )
