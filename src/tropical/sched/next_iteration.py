"""A multiplexing worker's next iteration as the toggle plans it, before new prefills join.

Who decodes in it: the running batch (one token further if an iteration is in flight), KV that
has landed or is on its way (it may land before the iteration starts: counting it is the safe
side), and prompts finishing in the iteration in flight. A prompt chunked in the iteration in
flight is ``carried``: the rest of it is still to compute, ahead of the queue.
``peak_context`` is their context once each has all its output tokens (its ``kv_tokens``):
what their decode iterations grow to.
Computed once per scheduling round, so trying many candidate prefills costs one latency
prediction each. The running batch is priced from the worker's sums and one pass over its
requests; a ``Decoding`` for each is built only for the callers that read them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.slack import Decoding, SlackRule, TpotBudget
from tropical.sched.worker import WorkerState


@dataclass(slots=True)
class NextIteration:
    """The decodes and queued prefills of ``worker``'s next iteration, and when it starts.

    The decodes are ``running`` (each with ``steps - step_base`` tokens by then; the tightest
    TPOT SLO among them is ``running_tpot``) and ``joining`` (the others, each with its own
    count). A value (not frozen: one is built per worker and scheduling round, and a frozen
    one costs several times as much to build; a written constructor, as BatchShape's).
    """

    start: float
    busy: bool
    running: tuple[Request, ...]
    steps: int
    joining: tuple[Decoding, ...]
    decode_context: int
    queued: tuple[Request, ...]
    running_tpot: float
    peak_context: int = 0
    carried: tuple[tuple[Request, int], ...] = ()
    _budget: TpotBudget | None = field(default=None, init=False, repr=False, compare=False)
    _min_tpot: float | None = field(default=None, init=False, repr=False, compare=False)

    def __init__(self, start: float, busy: bool, running: tuple[Request, ...], steps: int,
                 joining: tuple[Decoding, ...], decode_context: int, queued: tuple[Request, ...],
                 running_tpot: float, peak_context: int = 0,
                 carried: tuple[tuple[Request, int], ...] = ()) -> None:
        self.start, self.busy, self.running, self.steps = start, busy, running, steps
        self.joining, self.decode_context, self.queued = joining, decode_context, queued
        self.running_tpot, self.peak_context, self.carried = running_tpot, peak_context, carried
        self._budget, self._min_tpot = None, None

    @classmethod
    def of(cls, worker: WorkerState, now: float) -> NextIteration:
        busy = worker.busy_until > now
        start = worker.busy_until if busy else now
        steps = worker.steps + int(busy)  # each running request's tokens once the iteration ends
        running = tuple(worker.running.values())
        joining = [Decoding(r, r.generated, r.first_token_at) for r in worker.incoming.values()]
        carried = []
        for r in worker.in_flight() if busy else ():
            left = r.remaining_prompt - worker.inflight.get(r.id, r.remaining_prompt)
            if left > 0:
                carried.append((r, left))
            else:
                joining.append(Decoding(r, 1, start))
        context = worker.decode_context + len(running) * int(busy)
        peak = worker.decode_peak
        for d in joining:
            context += d.request.prompt_len + d.generated
            peak += d.request.kv_tokens
        return NextIteration(start, busy, running, steps, tuple(joining), context, tuple(worker.queued()),
                   worker.min_tpot(), peak, tuple(carried))

    def with_joining(self, decoding: Decoding) -> NextIteration:
        """This iteration with one more request joining its decodes."""
        req = decoding.request
        return NextIteration(self.start, self.busy, self.running, self.steps, (*self.joining, decoding),
                             self.decode_context + req.prompt_len + decoding.generated, self.queued,
                             self.running_tpot, self.peak_context + req.kv_tokens, self.carried)

    @property
    def decode_count(self) -> int:
        return len(self.running) + len(self.joining)

    @property
    def min_tpot(self) -> float:
        """The tightest TPOT SLO among the decodes (inf if none): all the per-iteration rule
        reads, without a pass over the running batch; kept, since every candidate asks."""
        if self._min_tpot is None:
            tightest = self.running_tpot
            for d in self.joining:  # a loop: compiled, a generator costs more than the few it reads
                tightest = min(tightest, d.request.slo.tpot)
            self._min_tpot = tightest
        return self._min_tpot

    @property
    def budget(self) -> TpotBudget:
        """The decodes' TPOT budget under both rules, priced on first use (the banked rule's
        deadline needs every running request's progress)."""
        if self._budget is None:
            terms = [(r.slo.tpot, r.first_token_at, self.steps - r.step_base) for r in self.running]
            terms += [(d.request.slo.tpot, d.first_token, d.generated) for d in self.joining]
            self._budget = TpotBudget.of_terms(terms)
        return self._budget

    def fits(self, iteration: float, rule: SlackRule) -> bool:
        """Would an iteration of ``iteration`` seconds, starting at ``start``, keep every
        decode's TPOT SLO under ``rule``? (The per-iteration rule reads only the tightest SLO,
        so the budget is priced for the banked rule alone.)"""
        if rule is SlackRule.ITERATION:
            return iteration <= self.min_tpot
        return self.budget.fits(iteration, self.start, rule)

    @property
    def decodes(self) -> tuple[Decoding, ...]:
        """Every decode of the iteration, running ones first."""
        steps = self.steps
        return (*(Decoding(r, steps - r.step_base, r.first_token_at) for r in self.running), *self.joining)

    def shape(self, prefills: list[Request]) -> BatchShape:
        """The batch with these prefills added to the decodes."""
        return BatchShape.of_batch([(r.remaining_prompt, r.computed) for r in prefills],
                                   self.decode_count, self.decode_context)
