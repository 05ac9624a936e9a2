"""A multiplexing worker's next iteration as the toggle plans it, before new prefills join.

Who decodes in it: the running batch (one token further if an iteration is in flight), KV that
has landed or is on its way (it may land before the iteration starts: counting it is the safe
side), and prompts finishing in the iteration in flight. A prompt chunked in the iteration in
flight is ``carried``: the rest of it is still to compute, ahead of the queue.
``peak_context`` is their context once each has all its output tokens (its ``kv_tokens``):
what their decode iterations grow to.
Computed once per scheduling round, so trying many candidate prefills costs one latency
prediction each.
"""

from __future__ import annotations

from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.slack import Decoding, TpotBudget
from tropical.sched.worker import WorkerState


@dataclass(frozen=True, slots=True)
class NextIteration:
    """The decodes and queued prefills of ``worker``'s next iteration, and when it starts."""

    start: float
    busy: bool
    decodes: tuple[Decoding, ...]
    decode_context: int
    queued: tuple[Request, ...]
    budget: TpotBudget
    peak_context: int = 0
    carried: tuple[tuple[Request, int], ...] = ()

    @classmethod
    def of(cls, worker: WorkerState, now: float) -> NextIteration:
        busy = worker.busy_until > now
        start = worker.busy_until if busy else now
        steps = worker.steps + int(busy)  # each running request's tokens once the iteration ends
        decodes = [Decoding(r, steps - r.step_base, r.first_token) for r in worker.running.values()]
        decodes += [Decoding(r, r.generated, r.first_token) for r in worker.incoming.values()]
        carried = []
        for r in worker.in_flight() if busy else ():
            left = r.remaining_prompt - worker.inflight.get(r.id, r.remaining_prompt)
            if left > 0:
                carried.append((r, left))
            else:
                decodes.append(Decoding(r, 1, start))
        context = peak = 0
        for d in decodes:
            context += d.request.prompt_len + d.generated
            peak += d.request.kv_tokens
        return cls(start, busy, tuple(decodes), context, tuple(worker.queued()), TpotBudget.of(decodes),
                   peak, tuple(carried))

    def shape(self, prefills: list[Request]) -> BatchShape:
        """The batch with these prefills added to the decodes."""
        return BatchShape.of_batch([(r.remaining_prompt, r.computed) for r in prefills],
                                   len(self.decodes), self.decode_context)
