"""The three baselines of DESIGN.md §2, all dispatching to the fewest unfinished tokens.

colocated: vLLM continuous batching, waiting prefills first in prefill-only iterations.
chunked:   vLLM with chunked prefill (Sarathi-Serve): decodes first, then prompt chunks under a
           token budget (2048 by default; the registry also has 512 and 1024).
disagg:    DistServe: prefill-only and decode-only workers, FCFS prefill batches, KV migration.
"""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.request import PrefillPath, Request
from tropical.sched.dispatch import ARRIVAL_ROLES, least_loaded_of
from tropical.sched.policy import Assignment, Policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState


def dispatch_to_least_loaded(req: Request, workers: Sequence[WorkerState],
                             path: PrefillPath) -> list[Assignment]:
    """Send ``req`` to the arrival-taking worker with the fewest unfinished tokens."""
    target = least_loaded_of(workers, ARRIVAL_ROLES)
    if target is None:
        raise RuntimeError("no live worker takes new requests")
    return [Assignment(req, target.id, path, "fewest unfinished tokens")]


class ColocatedPolicy(Policy):
    """Every worker prefills and decodes; ``chunked`` selects Sarathi-style mixed batches."""

    def __init__(self, max_batched_tokens: int, chunked: bool = False,
                 chunk_budget: int = 2048, max_seqs: int = 256, name: str | None = None) -> None:
        self.name = name or ("chunked" if chunked else "colocated")
        self._rules = (BatchRules(prefill_first=False, chunked=True, token_budget=chunk_budget,
                                  max_seqs=max_seqs) if chunked
                       else BatchRules(prefill_first=True, token_budget=max_batched_tokens,
                                       max_seqs=max_seqs))

    def roles(self, num_workers: int) -> list[Role]:
        return [Role.COLOCATED] * num_workers

    def rules(self, role: Role) -> BatchRules:
        return self._rules

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        return dispatch_to_least_loaded(req, workers, PrefillPath.COLOCATED)


def split_roles(num_workers: int, num_prefill: int | None, other: Role) -> list[Role]:
    """``num_prefill`` prefill workers (default half, at least one) then ``other`` workers."""
    prefill = max(1, num_workers // 2) if num_prefill is None else num_prefill
    if not 1 <= prefill < num_workers:
        raise ValueError(f"need 1..{num_workers - 1} prefill workers of {num_workers}, got {prefill}")
    return [Role.PREFILL] * prefill + [other] * (num_workers - prefill)


class DisaggPolicy(Policy):
    """Fixed prefill and decode workers; prefilled requests migrate their KV."""

    def __init__(self, max_batched_tokens: int, num_prefill: int | None = None,
                 max_seqs: int = 256, name: str = "disagg") -> None:
        self.name = name
        self.num_prefill = num_prefill
        self._prefill = BatchRules(prefill_first=True, token_budget=max_batched_tokens,
                                   max_seqs=max_seqs)
        self._decode = BatchRules(prefill_first=False, token_budget=max_seqs, max_seqs=max_seqs)

    def roles(self, num_workers: int) -> list[Role]:
        return split_roles(num_workers, self.num_prefill, Role.DECODE)

    def rules(self, role: Role) -> BatchRules:
        return self._prefill if role is Role.PREFILL else self._decode

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        return dispatch_to_least_loaded(req, workers, PrefillPath.PREFILL_WORKER)
