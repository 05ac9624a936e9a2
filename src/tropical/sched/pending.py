"""Prompts promised to a multiplexing worker's coming iterations, as the sums the toggle checks.

The toggle tries many candidates per scheduling round against the same worker; keeping the
promised prompts as running sums (count, prompt tokens, KV still to reserve, KV at their
longest, and their prefill shape) makes each try O(1) instead of a pass over the queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.worker import WorkerState


@dataclass(frozen=True, slots=True)
class Pending:
    """Sums over the prompts queued on, or promised to, one worker."""

    count: int = 0
    tokens: int = 0
    kv_new: int = 0
    peak: int = 0
    shape: BatchShape = BatchShape()

    @classmethod
    def of(cls, worker: WorkerState, requests: Iterable[Request],
           carried: Iterable[tuple[Request, int]] = ()) -> Pending:
        """``carried``: prompts chunked in the iteration in flight, with the tokens they will
        have left after it; they come first."""
        pending = cls()
        for req, left in carried:
            pending = pending.plus(req, worker, left)
        for req in requests:
            pending = pending.plus(req, worker)
        return pending

    def plus(self, req: Request, worker: WorkerState, left: int | None = None) -> Pending:
        """These prompts and ``req``, bound for ``worker``, with ``left`` of its prompt tokens
        still to compute (default: all it has not computed yet)."""
        left = req.remaining_prompt if left is None else left
        reserve = 0 if req.id in worker.holds else worker.kv_tokens_needed(req)
        return Pending(self.count + 1, self.tokens + left, self.kv_new + reserve,
                       self.peak + req.kv_tokens, self.shape.plus_prefill(left, req.prompt_len - left))

    def with_decodes(self, count: int, context: int) -> BatchShape:
        """One iteration running all these prompts whole beside ``count`` decodes."""
        shape = self.shape  # built directly: dataclasses.replace costs several times more
        return BatchShape(shape.prefill_tokens, shape.prefill_pairs, shape.prefill_cached,
                          shape.num_prefills, count, context)
