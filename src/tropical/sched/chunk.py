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
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.pending import Pending
from tropical.sched.slack import largest_chunk
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class Chunk:
    """One multiplexing iteration at its limit: ``tokens`` fresh prompt tokens beside the
    decodes, its time, the prompt compute it has room for (its time less the decodes'), and
    the fixed cost of a prompt chunk (a one-token chunk's compute). A value, hashed as a frozen
    one would be: never change one (it writes its constructor and hash, as ``BatchShape`` does,
    so that mypyc compiles them; one is built per worker priced)."""

    tokens: int
    iteration: float
    room: float
    overhead: float

    def __init__(self, tokens: int, iteration: float, room: float, overhead: float) -> None:
        self.tokens = tokens
        self.iteration = iteration
        self.room = room
        self.overhead = overhead

    def __hash__(self) -> int:
        return hash((self.tokens, self.iteration, self.room, self.overhead))

    @classmethod
    def of(cls, worker: WorkerState, decode: BatchShape, limit: float, near: int = 0) -> Chunk:
        """The largest chunk beside ``decode`` within ``limit`` seconds (zero tokens if none);
        ``near``: where the search starts (see ``largest_chunk``)."""
        priced: dict[int, float] = {}

        def time_of(n: int) -> float:
            """Priced once per size: the search has priced the chunk and a one-token chunk."""
            if n not in priced:
                priced[n] = worker.latency.iteration_time(decode.plus_prefill(n, 0))
            return priced[n]

        tokens = largest_chunk(worker.rules.token_budget - decode.decode_count, time_of, limit, near)
        if tokens == 0:
            return Chunk(0, 0.0, 0.0, 0.0)
        base = worker.latency.iteration_time(decode)
        iteration = time_of(tokens)
        overhead = time_of(1) - base
        return Chunk(tokens, iteration, max(iteration - base - overhead, 1e-9), overhead)

    def finish(self, worker: WorkerState, prompts: Pending, start: float) -> float:
        """End of the iteration that completes ``prompts`` fed in these chunks from ``start``:
        their compute as whole spans (chunking adds only a fixed cost per chunk) over the room
        each iteration has, and never fewer iterations than their tokens need, after the loads
        from host memory they wait for."""
        work = worker.latency.iteration_time(prompts.shape) - self.overhead
        steps = max(math.ceil(prompts.tokens / self.tokens), math.ceil(work / self.room))
        return start + prompts.loads + steps * self.iteration - max(0.0, steps * self.room - work)


@dataclass(slots=True)
class Lineup:
    """A multiplexing worker's queue as one scheduling round sees it: its prompts in the order
    a new prompt is placed among them (least slack first under laxity, else as queued), the
    sums of its prefixes (after the prompts chunked in the iteration in flight; ``prefix``
    sums them as far as asked), and, per chunk and start, when each prefix would be done. Every
    candidate of a round is placed in the same lineup, so these are computed once, not once per
    candidate. It also keeps, per chunk and start, candidates whose promises it refused
    (``keeps_promises``). It writes its constructor, which mypyc compiles (see ``BatchShape``)."""

    worker: WorkerState
    order: list[Request]
    keys: list[float]
    prefixes: list[Pending]
    laxity: bool
    _done: dict[tuple[Chunk, float], list[float | None]] = field(default_factory=dict)
    _refused: dict[tuple[Chunk, float], list[tuple[int, Pending]]] = field(default_factory=dict)

    def __init__(self, worker: WorkerState, order: list[Request], keys: list[float],
                 prefixes: list[Pending], laxity: bool) -> None:
        self.worker = worker
        self.order = order
        self.keys = keys
        self.prefixes = prefixes
        self.laxity = laxity
        self._done = {}
        self._refused = {}

    @classmethod
    def of(cls, worker: WorkerState, queue: Sequence[Request], carried: Sequence[tuple[Request, int]],
           laxity: bool) -> Lineup:
        """Under laxity each prompt's key is taken once, and ties keep queue order (compiled,
        ``sorted`` with the key as a bound method calls it in Python's own way)."""
        if not laxity:
            return Lineup(worker, list(queue), [], [Pending.of(worker, (), carried)], laxity)
        ranked = sorted([(worker.queue_key(req), place, req) for place, req in enumerate(queue)])
        return Lineup(worker, [req for _, _, req in ranked], [key for key, _, _ in ranked],
                      [Pending.of(worker, (), carried)], laxity)

    def prefix(self, count: int) -> Pending:
        """The sums of the first ``count`` prompts of the lineup (after those carried), summed
        as far as asked: most candidates are only priced behind the few prompts ahead of them."""
        prefixes = self.prefixes
        while len(prefixes) <= count:
            prefixes.append(prefixes[-1].plus(self.order[len(prefixes) - 1], self.worker))
        return prefixes[count]

    def place(self, req: Request) -> int:
        """How many prompts of the lineup ``req`` waits for: all under arrival order; under
        laxity those with a lower or equal queue key (it goes ahead of the rest)."""
        if not self.laxity:
            return len(self.order)
        return bisect_right(self.keys, self.worker.queue_key(req))

    def keeps_promises(self, chunk: Chunk, start: float, own: Pending, ahead: int) -> bool:
        """Would every prompt behind a candidate with sums ``own`` (placed after ``ahead``
        prompts) that meets its TTFT SLO without it still meet it with it run ahead of it?
        (Only those that do are priced with it: the sums are integers, so adding it last gives
        the same.) Under a monotone latency model a candidate placed no further back than one
        refused, whose own prompt is no smaller in any term, is refused without the walk: the
        prompt that the refused one would have cost its SLO is behind it too, and done no
        sooner (under a burst most of a worker's refusals are such)."""
        if self.refused(chunk, start, own, ahead):
            return False
        done = self._done_of(chunk, start)
        for j in range(ahead, len(self.order)):
            other = self.order[j]
            deadline = other.arrival + other.slo.ttft
            alone = done[j + 1]
            prefix = self.prefix(j + 1)
            if alone is None:
                alone = done[j + 1] = chunk.finish(self.worker, prefix, start)
            if deadline < alone:
                continue
            if chunk.finish(self.worker, prefix.merged(own), start) > deadline:
                self._refuse(chunk, start, own, ahead)
                return False
        return True

    def refused(self, chunk: Chunk, start: float, own: Pending, ahead: int) -> bool:
        """Has this lineup refused a candidate that one with sums ``own``, placed after
        ``ahead`` prompts, covers (see ``keeps_promises``)?"""
        if not self._refused:
            return False
        refused = self._refused.get((chunk, start))
        return refused is not None and any(ahead <= place and _covers(own, other) for place, other in refused)

    def _refuse(self, chunk: Chunk, start: float, own: Pending, ahead: int) -> None:
        """Keep a refusal (at most ``REFUSALS_KEPT`` per chunk and start, those another one
        covers dropped), where the latency model makes it cover others."""
        if not self.worker.latency.monotone:
            return
        kept = [(place, other) for place, other in self._refused.get((chunk, start), ())
                if not (place <= ahead and _covers(other, own))]
        self._refused[(chunk, start)] = [*kept[-(REFUSALS_KEPT - 1):], (ahead, own)]

    def _done_of(self, chunk: Chunk, start: float) -> list[float | None]:
        """When the first ``count`` prompts of the lineup would be done, fed in ``chunk``s from
        ``start``, by ``count``: filled in as candidates ask (None: not priced yet)."""
        done = self._done.get((chunk, start))
        if done is None:
            done = self._done[(chunk, start)] = [None] * (len(self.order) + 1)
        return done


REFUSALS_KEPT: Final = 8
"""Refused candidates a lineup keeps per chunk and start (a look through them must stay cheaper
than the walk it saves)."""


def _covers(own: Pending, refused: Pending) -> bool:
    """Is a prompt with sums ``own`` at least as much work as one with ``refused`` in every term
    that a chunked finish reads?"""
    return (own.count == refused.count and own.tokens >= refused.tokens and own.pairs >= refused.pairs
            and own.cached >= refused.cached and own.loads >= refused.loads)
