"""Per-worker batch formation, shared by the simulator and the engine.

A batch is the worker's whole decoding set plus prefill spans (request, new tokens, cached
tokens) taken first-come first-served under the rules' token budget and sequence cap. A prompt
whose KV does not fit blocks the queue behind it (FCFS), so memory never over-commits. A
multiplexing worker's TPOT guard checks the planned prefills against its decodes' slack as the
batch forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape
from tropical.core.request import PrefillPath, Request
from tropical.sched.rules import decodes
from tropical.sched.slack import Decoding, SlackRule, TpotBudget, largest_chunk
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class Batch:
    """One iteration's work on one worker (one or two per iteration: a written constructor,
    see BatchShape). ``held``: a multiplexed prompt waits only until a decode that is behind its
    TPOT SLO catches up, so the next iteration may differ though no request finishes or
    arrives (a substrate must form it afresh). ``loaded``: tokens of KV the worker loads from
    host memory before the iteration can run (its prefix cache's host tier)."""

    prefills: list[tuple[Request, int, int]]
    decode_count: int
    decode_context: int
    held: bool
    loaded: int

    def __init__(self, prefills: list[tuple[Request, int, int]], decode_count: int = 0,
                 decode_context: int = 0, held: bool = False) -> None:
        self.prefills = prefills
        self.decode_count = decode_count
        self.decode_context = decode_context
        self.held = held
        self.loaded = 0

    @property
    def shape(self) -> BatchShape:
        return BatchShape.of_batch([(new, cached) for _, new, cached in self.prefills],
                                   self.decode_count, self.decode_context)

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decode_count

    @property
    def decode_only(self) -> bool:
        return not self.prefills and self.decode_count > 0


def form_batch(worker: WorkerState, now: float = 0.0) -> Batch:
    """The next iteration's batch for ``worker`` under its rules (empty when it has no work).

    ``now`` is the iteration's start; only the TPOT guard of multiplexing workers reads it.
    """
    batch = _guard_tpot(worker, _compose(worker), now)
    if worker.rules.spare_finishing:
        batch = _spare_finishing(worker, batch, now)
    worker.start_prefills([(req, new) for req, new, _ in batch.prefills])
    batch.loaded = worker.take_loads()
    return batch


def _compose(worker: WorkerState) -> Batch:
    rules = worker.rules
    if rules.prefill_first:
        prefills = take_prefills(worker, rules.token_budget, rules.max_seqs - worker.batch_size)
        if prefills or not decodes(worker.role):
            return Batch(prefills)
        return Batch([], worker.batch_size, worker.decode_context)
    decoding = worker.batch_size if decodes(worker.role) else 0
    prefills = take_prefills(worker, rules.token_budget - decoding, rules.max_seqs - decoding)
    return Batch(prefills, decoding, worker.decode_context if decoding else 0)


def _guard_tpot(worker: WorkerState, batch: Batch, now: float) -> Batch:
    """Stop before the first multiplexed prefill that would stretch the iteration past the
    decodes' TPOT slack (the batch may differ from what the toggle planned: KV landed since);
    under chunked rules, cut that prompt to the largest chunk that still fits instead, and
    count requests about to decode here among those the iteration must not hold up."""
    rule = worker.rules.tpot_guard
    if rule is None or all(req.path is not PrefillPath.MULTIPLEX for req, _, _ in batch.prefills):
        return batch
    limit = _tpot_limit(worker, batch, now, rule)
    if limit is None:
        return batch
    limit -= worker.loads_pending() * worker.host_load_s     # the iteration waits for them too
    shape = BatchShape.decode(batch.decode_count, batch.decode_context)
    for i, (req, new, cached) in enumerate(batch.prefills):
        stretched = shape.plus_prefill(new, cached)
        if req.path is not PrefillPath.MULTIPLEX or worker.latency.iteration_time(stretched) <= limit:
            shape = stretched
            continue
        chunk = _chunk(worker, shape, new, cached, limit) if worker.rules.chunked else 0
        kept = batch.prefills[:i] + ([(req, chunk, cached)] if chunk else [])
        held = not kept and worker.rules.chunked and limit < _tightest_tpot(worker, batch)
        return Batch(kept, batch.decode_count, batch.decode_context, held)
    return batch


def _spare_finishing(worker: WorkerState, batch: Batch, now: float) -> Batch:
    """The batch cut before the first prompt, whole or a chunk, that would end the iteration
    after the TTFT deadline of a prompt it finishes, one that meets it with the prompts ahead
    of it alone: chunked prefill fills each iteration's room with the prompts queued next, and
    a prompt's first token comes when its iteration ends. Under laxity order the finished
    prompts are the more urgent; those cut wait one iteration. (Cutting only a last chunk left
    a short prompt's iteration to whole prompts queued behind it: under a loose TPOT SLO, where
    an iteration holds several, a multiplexed prompt predicted in time missed by the length of
    theirs.)"""
    if len(batch.prefills) < 2:
        return batch
    start = now + worker.loads_pending() * worker.host_load_s
    shape = BatchShape.decode(batch.decode_count, batch.decode_context)
    in_time: list[Request] = []
    for place, (req, new, cached) in enumerate(batch.prefills):
        shape = shape.plus_prefill(new, cached)
        end = start + worker.latency.iteration_time(shape)
        if any(end - done.arrival > done.slo.ttft for done in in_time):
            return Batch(batch.prefills[:place], batch.decode_count, batch.decode_context, batch.held)
        if new == req.remaining_prompt and end - req.arrival <= req.slo.ttft:
            in_time.append(req)
    return batch


def _chunk(worker: WorkerState, shape: BatchShape, new: int, cached: int, limit: float) -> int:
    """The most of ``new`` prompt tokens that ``shape`` can take within ``limit`` seconds."""
    def time_of(n: int) -> float:
        return worker.latency.iteration_time(shape.plus_prefill(n, cached))

    worker.last_chunk = largest_chunk(new - 1, time_of, limit, worker.last_chunk)
    return worker.last_chunk


def _tpot_limit(worker: WorkerState, batch: Batch, now: float, rule: SlackRule) -> float | None:
    """The longest the iteration may take under ``rule`` (None: nobody waits on it). The
    paper's per-iteration rule needs only the tightest SLO, not each request's progress; under
    chunked multiplexing the iteration must also not leave any decode behind its TPOT SLO
    (tokens x SLO since its first token): a request that migrated here waited for the iteration
    in flight, and iterations at the SLO would never let it catch up, so its mean TPOT would
    end above the SLO (the banked rule's deadline, never more than the SLO itself)."""
    if rule is SlackRule.ITERATION:
        if not worker.rules.chunked:
            return worker.min_tpot() if worker.running else None
        limit = _caught_up_limit(worker, batch, now)
        return None if limit == math.inf else limit
    decoding = [Decoding(r, worker.generated(r), r.first_token_at) for r in worker.running.values()]
    if worker.rules.chunked:
        decoding += _prospective(worker, batch, now)
    return TpotBudget.of(decoding).limit(now, rule) if decoding else None


def _caught_up_limit(worker: WorkerState, batch: Batch, now: float) -> float:
    """The per-iteration rule under chunked multiplexing, priced without a Decoding per request
    (every chunk asks): the tightest SLO of the decodes and of those waiting on the iteration,
    within the room the tightest TTFT SLO seen leaves (``BatchRules.tightest``), and the banked
    deadline of those that may be behind (KV on its way, and the decodes behind their pace or
    within one SLO of it: ``WorkerState.catch_up_deadline``; a multiplexed prompt's first token
    comes at the iteration's start, on pace)."""
    limit = _tightest_tpot(worker, batch)
    tightest = worker.rules.tightest
    if tightest is not None and limit < math.inf:
        decode = BatchShape.decode(batch.decode_count, batch.decode_context)
        limit = tightest.room(worker.latency, decode, limit)
    for req in worker.incoming.values():
        limit = min(limit, req.on_pace_until(req.generated) - now)
    return min(limit, worker.catch_up_deadline(now) - now)


def _tightest_tpot(worker: WorkerState, batch: Batch) -> float:
    """The tightest TPOT SLO among those this iteration must not hold up (``_waiting_on`` and
    the decodes; loops, not lists: every chunk asks)."""
    tightest = worker.min_tpot()
    for req in worker.incoming.values():
        tightest = min(tightest, req.slo.tpot)
    for req, _, _ in batch.prefills:
        if req.path is PrefillPath.MULTIPLEX:
            tightest = min(tightest, req.slo.tpot)
    return tightest


def _prospective(worker: WorkerState, batch: Batch, now: float) -> list[Decoding]:
    """Those ``_waiting_on`` this iteration, each as it will decode: migrated KV with its own
    progress, a multiplexed prompt with its first token at the iteration's start."""
    incoming, multiplexed = _waiting_on(worker, batch)
    return ([Decoding(r, r.generated, r.first_token_at) for r in incoming]
            + [Decoding(r, 1, now) for r in multiplexed])


def _waiting_on(worker: WorkerState, batch: Batch) -> tuple[list[Request], list[Request]]:
    """Requests that will decode here soon and wait for this iteration to end: KV on its way,
    and the multiplexed prompts themselves. Chunked multiplexing keeps every iteration within
    their TPOT SLOs too, so that no stream waits long for its next token."""
    multiplexed = [r for r, _, _ in batch.prefills if r.path is PrefillPath.MULTIPLEX]
    return list(worker.incoming.values()), multiplexed


def take_prefills(worker: WorkerState, budget: int, seats: int) -> list[tuple[Request, int, int]]:
    """Prefill spans from the head of the queue, reserving KV for each newly started prompt."""
    spans: list[tuple[Request, int, int]] = []
    if worker.rules.piece_tokens:
        worker.held_first()
    for req in worker.waiting:
        if seats <= 0 or budget <= 0 or not worker.reserve(req):
            break
        new = req.remaining_prompt
        if new > budget:
            if not worker.rules.chunked and spans:
                break
            new = budget if worker.rules.chunked else min(new, worker.rules.piece_tokens or new)
        spans.append((req, new, req.computed))
        budget -= new
        seats -= 1
    return spans
