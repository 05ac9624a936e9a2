"""One engine worker: the scheduler's batch formation driving the real forward pass.

Each step is schedule (sched's ``form_batch``, the same code the simulator runs), run (one forward
over the batch's spans, then sampling), post-process (book progress on the WorkerState exactly as
the simulator does, free finished requests' KV). The WorkerState's KVPool mirrors the engine cache
block for block, so a batch the scheduler admits always fits the cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tropical.core.latency.fitted import FittedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.engine.batch import FlatBatch, Span
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel
from tropical.engine.sampling import SamplingParams, make_generator, sample
from tropical.sched.batching import Batch, form_batch
from tropical.sched.kv import KVPool
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState

# The engine measures time instead of predicting it; the WorkerState only prices work for the TPOT
# guard and for prefill-only workers, so a colocated engine without a profile runs unpriced.
UNPRICED = FittedModel(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, transfer_bandwidth=1.0)


@dataclass(slots=True)
class Sequence:
    """A request's tokens and sampling state on this engine."""

    req: Request
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)

    @property
    def cached(self) -> int:
        """Tokens whose KV is in the cache once the prompt is done: all but the last sampled one."""
        return self.req.prompt_len + len(self.output) - 1


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that ended this step; ``reason`` is "length" (max tokens) or "eos"."""

    req: Request
    token_ids: list[int]
    reason: str


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
                 worker_id: int = 0) -> None:
        self.model = model
        self.cache = cache
        self.eos_ids = eos_ids
        pool = KVPool(capacity_blocks=cache.num_blocks, block_size=cache.block_size)
        self.state = WorkerState(worker_id, Role.COLOCATED, rules or BatchRules(), pool, latency)
        self.sequences: dict[int, Sequence] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.state.waiting or self.state.running)

    def submit(self, req: Request, prompt_ids: list[int], sampling: SamplingParams) -> None:
        """Queue ``req``; its ``output_len`` is the max tokens to generate."""
        if len(prompt_ids) != req.prompt_len:
            raise ValueError(f"request {req.id}: {len(prompt_ids)} prompt ids, prompt_len {req.prompt_len}")
        if req.id in self.sequences:
            raise ValueError(f"request {req.id} is already on this worker")
        generator = make_generator(sampling, self.cache.device)
        self.sequences[req.id] = Sequence(req, list(prompt_ids), sampling, generator)
        self.state.enqueue(req)

    def step(self, now: float) -> IterationReport:
        """Form, run and book one iteration that starts at ``now`` (seconds on the caller's clock)."""
        batch = form_batch(self.state, now)
        start = time.perf_counter()
        tokens = self._run(batch) if not batch.is_empty else {}
        duration = time.perf_counter() - start
        finished = self._book(batch, tokens, now + duration)
        return IterationReport(
            duration=duration,
            shape=batch.shape,
            prefill_tokens=sum(new for _, new, _ in batch.prefills),
            decode_count=batch.decode_count,
            kv_blocks_used=self.cache.used_blocks,
            kv_blocks_total=self.cache.num_blocks,
            waiting=len(self.state.waiting),
            running=len(self.state.running),
            finished=finished,
        )

    def _run(self, batch: Batch) -> dict[int, int]:
        """One forward pass; the next token of every sequence that decodes or completes its prompt."""
        decoding = list(self.state.running.values()) if batch.decode_count else []
        spans = [self._decode_span(req) for req in decoding]
        spans += [self._prefill_span(req, new, cached) for req, new, cached in batch.prefills]
        completes = [True] * len(decoding) + [cached + new == req.prompt_len
                                              for req, new, cached in batch.prefills]
        logits = self.model(FlatBatch.build(spans, self.cache), self.cache)
        rows = [i for i, wanted in enumerate(completes) if wanted]
        seqs = [self.sequences[spans[i].seq_id] for i in rows]
        ids = sample(logits[rows], [s.params for s in seqs], [s.generator for s in seqs])
        return {s.req.id: token for s, token in zip(seqs, ids, strict=True)}

    def _decode_span(self, req: Request) -> Span:
        seq = self.sequences[req.id]
        return Span(req.id, [seq.output[-1]], seq.cached)

    def _prefill_span(self, req: Request, new: int, cached: int) -> Span:
        return Span(req.id, self.sequences[req.id].prompt[cached:cached + new], cached)

    def _book(self, batch: Batch, tokens: dict[int, int], now: float) -> list[FinishedRequest]:
        """Record progress in the order the simulator does: decodes first, then prefills."""
        for rid, token in tokens.items():
            self.sequences[rid].output.append(token)
        done = [(req, "length") for req in self.state.advance_decodes(1, now)] if batch.decode_count else []
        for req, new, _ in batch.prefills:
            if self.state.complete_prefill(req, new, now) and req.finish is not None:
                done.append((req, "length"))
        done += [(self._stop_at_eos(rid, now), "eos") for rid, token in tokens.items()
                 if token in self.eos_ids and self.sequences[rid].req.finish is None]
        return [self._retire(req, reason) for req, reason in done]

    def _stop_at_eos(self, rid: int, now: float) -> Request:
        """End a request early: abort frees its reserved KV and drops it from the decode batch
        (it keeps ``generated`` as booked so far), then mark it finished like a normal finish."""
        req = self.sequences[rid].req
        self.state.abort(req)
        req.finish = now
        return req

    def _retire(self, req: Request, reason: str) -> FinishedRequest:
        self.cache.free(req.id)
        seq = self.sequences.pop(req.id)
        return FinishedRequest(req, seq.output, reason)
