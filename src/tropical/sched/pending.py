"""Prompts promised to a multiplexing worker's coming iterations, as the sums the toggle checks.

The toggle tries many candidates per scheduling round against the same worker; keeping the
promised prompts as running sums (count, prompt tokens, KV still to reserve, KV at their
longest, and their prefill shape) makes each try O(1) instead of a pass over the queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape, attention_pairs
from tropical.core.request import Request
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class Pending:
    """Sums over the prompts queued on, or promised to, one worker: ``count`` prompts of
    ``tokens`` tokens still to compute over ``cached`` tokens already cached, with ``pairs``
    attention pairs (their prefill ``shape``), ``kv_new`` tokens of KV still to reserve,
    ``peak`` at their longest, and ``loads`` seconds of KV to load from host memory before
    they run (the prefix cache's host tier; the iterations that start them wait). A value:
    ``plus`` builds a new one (not frozen, and the shape not kept as a BatchShape: the toggle
    builds one per candidate it tries, and a frozen one, or a second object, costs several
    times as much to build; a written constructor, as BatchShape's)."""

    count: int = 0
    tokens: int = 0
    kv_new: int = 0
    peak: int = 0
    pairs: int = 0
    cached: int = 0
    loads: float = 0.0

    def __init__(self, count: int = 0, tokens: int = 0, kv_new: int = 0, peak: int = 0,
                 pairs: int = 0, cached: int = 0, loads: float = 0.0) -> None:
        self.count = count
        self.tokens = tokens
        self.kv_new = kv_new
        self.peak = peak
        self.pairs = pairs
        self.cached = cached
        self.loads = loads

    @classmethod
    def of(cls, worker: WorkerState, requests: Iterable[Request],
           carried: Iterable[tuple[Request, int]] = ()) -> Pending:
        """``carried``: prompts chunked in the iteration in flight, with the tokens they will
        have left after it; they come first."""
        pending = Pending()
        for req, left in carried:
            pending = pending.plus(req, worker, left)
        for req in requests:
            pending = pending.plus(req, worker)
        return pending

    def plus(self, req: Request, worker: WorkerState, left: int | None = None) -> Pending:
        """These prompts and ``req``, bound for ``worker``, with ``left`` of its prompt tokens
        still to compute (default: all it has not computed yet, or has not cached there)."""
        loads = self.loads
        if left is None:
            left, cached, reserve = worker.prompt_and_kv(req)
            loads += worker.load_time(req)
        else:
            cached, reserve = req.prompt_len - left, worker.kv_to_reserve(req)
        if req.id in worker.holds:
            reserve = 0
        return Pending(self.count + 1, self.tokens + left, self.kv_new + reserve,
                       self.peak + req.kv_tokens, self.pairs + attention_pairs(left, cached),
                       self.cached + cached, loads)

    def merged(self, other: Pending) -> Pending:
        """These prompts and ``other``'s: ``plus`` of each of them in turn gives the same sums, so
        a candidate's own sums, taken once, are merged into each prefix of a queue it is tried
        behind instead of looked up in the worker's cache for every one."""
        return Pending(self.count + other.count, self.tokens + other.tokens, self.kv_new + other.kv_new,
                       self.peak + other.peak, self.pairs + other.pairs, self.cached + other.cached,
                       self.loads + other.loads)

    @property
    def shape(self) -> BatchShape:
        """One iteration running all these prompts whole."""
        return self.with_decodes(0, 0)

    def with_decodes(self, count: int, context: int) -> BatchShape:
        """One iteration running all these prompts whole beside ``count`` decodes."""
        return BatchShape(self.tokens, self.pairs, self.cached, self.count, count, context)
