"""One engine worker in one process: a one-worker sched ``Cluster`` in front of an Executor.

Each step is schedule (``Cluster.plan``, the same code the simulator and the router run), run (one
forward over the batch's spans, then sampling), post-process (``Cluster.book`` books progress
exactly as the simulator does, then finished requests' KV is freed). The WorkerState's KVPool
mirrors the engine cache block for block, so a batch the scheduler admits always fits the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.core.sampling import SamplingParams, TokenLogprobs
from tropical.engine.block_hash import block_hashes
from tropical.engine.executor import Executor
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.sched.baselines import ColocatedPolicy
from tropical.sched.batching import Batch
from tropical.sched.cluster import Cluster, Fail
from tropical.sched.rules import BatchRules, Role
from tropical.sched.step import TokenConstraint, TokenSequence, record_step, step_spec
from tropical.sched.worker import UNPRICED, WorkerState, worker_state


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that ended; ``reason`` is "length" (max tokens) or "eos" (an end of sequence or
    a stop token id, the last of ``token_ids``); the logprobs its sampling params asked for (the
    prompt's from its second token on)."""

    req: Request
    token_ids: list[int]
    reason: str
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)


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


class EngineWorker:
    """A model, its paged cache and the scheduler state that decides each batch."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, rules: BatchRules | None = None,
                 latency: LatencyModel = UNPRICED, eos_ids: frozenset[int] = frozenset(),
                 worker_id: int = 0, prefix_cache: bool = False) -> None:
        self.executor = Executor(model, cache)
        state = worker_state(worker_id, Role.COLOCATED, rules or BatchRules(), cache.num_blocks,
                             cache.block_size, latency, prefix_cache)
        self.cluster = Cluster([state], ColocatedPolicy(state.rules.token_budget))
        self.eos_ids = eos_ids
        self.sequences: dict[int, TokenSequence] = {}

    @property
    def state(self) -> WorkerState:
        return self.cluster.workers[0]

    @property
    def cache(self) -> PagedKVCache:
        return self.executor.cache

    @property
    def has_work(self) -> bool:
        return bool(self.state.waiting or self.state.running)

    def submit(self, req: Request, prompt_ids: list[int], sampling: SamplingParams,
               constraint: TokenConstraint | None = None) -> None:
        """Queue ``req``; its ``output_len`` is the max tokens to generate; ``constraint``: the
        grammar its output follows. Raises ValueError for a request this worker can never hold.
        With a prefix cache, ``req`` gets its prompt's block names (``prefix``) here, so its cached
        prefix is found, unless it asks for prompt logprobs (every prompt position is computed)."""
        if req.id in self.sequences:
            raise ValueError(f"request {req.id} is already on worker {self.state.id}")
        if self.state.kv.cache is not None and sampling.prompt_logprobs is None:
            size = self.cache.block_size
            req.prefix, req.prefix_block = block_hashes(prompt_ids, size), size
        seq = TokenSequence(req, list(prompt_ids), sampling, constraint=constraint)
        refused = next((e.reason for e in self.cluster.arrive(req, req.arrival) if isinstance(e, Fail)), None)
        if refused is not None:
            raise ValueError(f"request {req.id}: {refused}")
        self.sequences[req.id] = seq

    def step(self, now: float) -> IterationReport:
        """Form, run and book one iteration that starts at ``now`` (seconds on the caller's clock)."""
        batch = self.cluster.plan(self.state.id, now)
        start = time.perf_counter()
        finished = self._run(batch, now) if batch is not None else []
        duration = time.perf_counter() - start
        self.executor.free(f.req.id for f in finished)
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

    def _run(self, batch: Batch, now: float) -> list[FinishedRequest]:
        """Execute ``batch`` and book it; the requests it finished, with their tokens."""
        start = time.perf_counter()
        out = self.executor.run(step_spec(batch, self.state.running, self.sequences, self.eos_ids))
        recorded = record_step(out, self.sequences, self.eos_ids)
        if recorded.failed:
            raise ValueError("; ".join(f"request {rid}: {why}" for rid, why in recorded.failed.items()))
        end = now + time.perf_counter() - start
        booking = self.cluster.book(self.state.id, batch, end, eos=recorded.ended)
        done = [(req, reason, self.sequences.pop(req.id)) for req, reason in booking.finished]
        return [FinishedRequest(req, seq.output, reason, seq.logprobs, seq.prompt_logprobs)
                for req, reason, seq in done]
