"""The scheduling half of an engine worker: which spans run next and what their tokens mean.

A planner holds a worker's WorkerState and each request's tokens. ``plan`` turns sched's batch
into spans for the executor; ``book`` records the sampled tokens exactly as the simulator books
an iteration. It never touches the model, so the same code runs beside the model in one process
(``EngineWorker``) or in the router, in front of a worker process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tropical.core.request import Request
from tropical.engine.batch import Span
from tropical.engine.sampling import SamplingParams
from tropical.sched.batching import Batch, form_batch
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class Sequence:
    """A request's tokens and sampling settings; ``output`` holds every token sampled so far."""

    req: Request
    prompt: list[int]
    params: SamplingParams
    ignore_eos: bool = False
    output: list[int] = field(default_factory=list)

    @property
    def cached(self) -> int:
        """Tokens whose KV is in the cache once the prompt is done: all but the last sampled one."""
        return self.req.prompt_len + len(self.output) - 1


@dataclass(frozen=True, slots=True)
class SampleRow:
    """Sample the next token of ``seq_id`` from its span's logits; ``step`` seeds the draw."""

    seq_id: int
    params: SamplingParams
    step: int


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What an executor runs: one forward over ``spans``, then a token for each of ``samples``
    (in span order; a prompt chunk that does not end its prompt samples nothing)."""

    spans: list[Span]
    samples: list[SampleRow]


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """sched's batch and the executor's view of it."""

    batch: Batch
    spec: StepSpec


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that ended; ``reason`` is "length" (max tokens) or "eos"."""

    req: Request
    token_ids: list[int]
    reason: str


@dataclass(frozen=True, slots=True)
class Booked:
    """What a step changed: new tokens per request, requests that ended, and requests whose
    prompt finished on a worker that does not decode (they now wait to migrate)."""

    tokens: dict[int, int]
    finished: list[FinishedRequest]
    prefilled: list[Request]


class StepPlanner:
    """One worker's queue and batch as sched sees it, plus the tokens sched does not know."""

    def __init__(self, state: WorkerState, eos_ids: frozenset[int] = frozenset()) -> None:
        self.state = state
        self.eos_ids = eos_ids
        self.sequences: dict[int, Sequence] = {}

    @property
    def has_work(self) -> bool:
        return bool(self.state.waiting or self.state.running or self.state.inbox)

    def add(self, seq: Sequence) -> None:
        """Track ``seq`` here (a new request, or one whose KV is migrating in)."""
        req = seq.req
        if len(seq.prompt) != req.prompt_len:
            raise ValueError(f"request {req.id}: {len(seq.prompt)} prompt ids, prompt_len {req.prompt_len}")
        if req.id in self.sequences:
            raise ValueError(f"request {req.id} is already on worker {self.state.id}")
        self.sequences[req.id] = seq

    def plan(self, now: float) -> PlannedStep | None:
        """The next iteration starting at ``now``, or None when there is nothing to run."""
        self.state.admit_inbox()
        batch = form_batch(self.state, now)
        if batch.is_empty:
            return None
        decoding = [self.sequences[rid] for rid in self.state.running] if batch.decode_count else []
        spans = [Span(s.req.id, [s.output[-1]], s.cached) for s in decoding]
        samples = [SampleRow(s.req.id, s.params, len(s.output)) for s in decoding]
        for req, new, cached in batch.prefills:
            seq = self.sequences[req.id]
            spans.append(Span(req.id, seq.prompt[cached:cached + new], cached))
            if cached + new == req.prompt_len:
                samples.append(SampleRow(req.id, seq.params, 0))
        return PlannedStep(batch, StepSpec(spans, samples))

    def book(self, planned: PlannedStep, tokens: dict[int, int], now: float) -> Booked:
        """Record an executed step in the order the simulator does: decodes first, then prefills."""
        for rid, token in tokens.items():
            self.sequences[rid].output.append(token)
        batch, state = planned.batch, self.state
        done = [(req, "length") for req in state.advance_decodes(1, now)] if batch.decode_count else []
        prefilled = []
        for req, new, _ in batch.prefills:
            if not state.complete_prefill(req, new, now):
                continue
            if req.finish is not None:
                done.append((req, "length"))
            elif not state.role.decodes:
                prefilled.append(req)
        done += [(self._stop_at_eos(rid, now), "eos") for rid, token in tokens.items()
                 if self._ends_at(rid, token)]
        prefilled = [req for req in prefilled if req.finish is None]
        return Booked(tokens, [self._retire(req, reason) for req, reason in done], prefilled)

    def _ends_at(self, rid: int, token: int) -> bool:
        seq = self.sequences[rid]
        return token in self.eos_ids and not seq.ignore_eos and seq.req.finish is None

    def _stop_at_eos(self, rid: int, now: float) -> Request:
        """End a request early: abort frees its reserved KV and drops it from the decode batch
        (it keeps ``generated`` as booked so far), then mark it finished like a normal finish."""
        req = self.sequences[rid].req
        self.state.abort(req)
        req.finish = now
        return req

    def _retire(self, req: Request, reason: str) -> FinishedRequest:
        seq = self.sequences.pop(req.id)
        return FinishedRequest(req, seq.output, reason)

    def remove(self, rid: int) -> Sequence | None:
        """Forget a request wherever it is on this worker (aborted, or migrated away)."""
        seq = self.sequences.pop(rid, None)
        if seq is not None:
            self.state.abort(seq.req)
            self.state.incoming.pop(rid, None)
            if seq.req in self.state.inbox:
                self.state.inbox.remove(seq.req)
        return seq
