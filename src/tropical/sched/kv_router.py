"""Cache-aware router baselines, as production runs them in front of vLLM (DESIGN.md §6).

kv-router:        Dynamo's KV router over chunked-prefill colocated workers: each request goes
                  to the worker of lowest cost, overlap weight x the prefill blocks it would
                  have (the request's uncached blocks there plus the prompts queued there) + the
                  worker's active KV blocks.
kv-router-disagg: disaggregated prefill and decode workers; a prompt goes to the prefill worker
                  of lowest such cost, unless the decode worker chosen by load lacks at most
                  ``local_limit`` of its tokens, which then prefills it locally (Dynamo's and
                  TensorRT-LLM's conditional disaggregation, llm-d's prefix-based P/D decider).
"""

from __future__ import annotations

from collections.abc import Sequence

from tropical.core.request import PrefillPath, Request
from tropical.sched.baselines import ColocatedPolicy, split_roles
from tropical.sched.dispatch import (
    ARRIVAL_ROLES,
    NewTokenFloors,
    cheapest,
    cheapest_of,
    least_loaded_of,
    with_workers,
)
from tropical.sched.load_index import ascending, blocks, fleet_index
from tropical.sched.policy import Assignment, Policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState

OVERLAP_WEIGHT = 64.0
"""The weight of prefill blocks against active blocks, as users tune it (Dynamo's default is 1;
on the conversation trace 64 is the strongest of 1 to 256: see the README's settings)."""
LOCAL_PREFILL_LIMIT = 1000
"""Tokens a decode worker may prefill itself under conditional disaggregation (Dynamo's
``max_local_prefill_length`` default)."""


def kv_cost(req: Request, worker: WorkerState, weight: float) -> float:
    """Dynamo's routing cost of ``req`` on ``worker``, in KV blocks: the prompt tokens it would
    prefill there (its own not cached there, and those of the prompts routed there before it)
    and the blocks of the sequences active there (decoding contexts and queued prompts)."""
    new, _ = worker.prompt_split(req)
    prefill = worker.kv.blocks_for(new + worker.waiting_prompt)
    return weight * prefill + worker.kv.blocks_for(worker.decode_context + worker.waiting_prompt)


def lowest_cost(req: Request, workers: Sequence[WorkerState], roles: Sequence[Role],
                weight: float) -> WorkerState | None:
    """The live worker of ``roles`` of lowest ``kv_cost`` (lowest id breaks ties), priced from
    the lowest bound up: its cost were it to lack only the floor of the tokens it lacks, its
    decode contexts as last booked (see ``sched.lag``); over an indexed fleet, the bounds of
    all of them in a few vector operations (``LoadIndex``)."""
    floors = NewTokenFloors.of(req, workers)
    index = fleet_index(workers)
    if index is None:
        best = cheapest((w for w in workers if w.role in roles), lambda w: kv_bound(w, floors.at(w), weight),
                        lambda w: kv_cost(req, w, weight))
        return None if best is None else best[0]
    ids = index.live_ids(roles)
    waiting, size = index.waiting_prompt[ids], index.block_size[ids]
    bounds = (weight * blocks(floors.vector(len(workers))[ids] + waiting, size)
              + blocks(index.decode_context[ids] + waiting, size))
    best = cheapest_of(with_workers(ascending(bounds, ids), workers), lambda w: kv_cost(req, w, weight))
    return None if best is None else best[0]


def kv_bound(worker: WorkerState, new_floor: int, weight: float) -> float:
    """``kv_cost`` were the worker to lack ``new_floor`` prompt tokens, its decode contexts as
    last booked."""
    waiting, blocks_for = worker.waiting_prompt, worker.kv.blocks_for
    return weight * blocks_for(new_floor + waiting) + blocks_for(worker.decode_context_floor + waiting)


class KVRouterPolicy(ColocatedPolicy):
    """Colocated chunked-prefill workers behind Dynamo's KV router."""

    routes_by_prefix = True

    def __init__(self, chunk_budget: int = 512, max_seqs: int = 256, weight: float = OVERLAP_WEIGHT,
                 name: str = "kv-router") -> None:
        super().__init__(chunk_budget, chunked=True, chunk_budget=chunk_budget, max_seqs=max_seqs, name=name)
        self.weight = weight

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        target = lowest_cost(req, workers, ARRIVAL_ROLES, self.weight)
        if target is None:
            raise RuntimeError("no live worker takes new requests")
        return [Assignment(req, target.id, PrefillPath.COLOCATED, "lowest KV-router cost")]


class KVRouterDisaggPolicy(Policy):
    """Prefill workers routed by overlap plus load, decode workers by load, and short uncached
    prompts prefilled where they decode."""

    routes_by_prefix = True

    def __init__(self, max_batched_tokens: int, chunk_budget: int = 512, num_prefill: int | None = None,
                 max_seqs: int = 256, weight: float = OVERLAP_WEIGHT, local_limit: int = LOCAL_PREFILL_LIMIT,
                 name: str = "kv-router-disagg") -> None:
        self.name = name
        self.weight = weight
        self.num_prefill = num_prefill
        self.local_limit = local_limit
        self._prefill = BatchRules(prefill_first=True, token_budget=max_batched_tokens, max_seqs=max_seqs)
        self._decode = BatchRules(prefill_first=False, chunked=True, token_budget=chunk_budget,
                                  max_seqs=max_seqs)

    def roles(self, num_workers: int) -> list[Role]:
        return split_roles(num_workers, self.num_prefill, Role.MULTIPLEX)

    def rules(self, role: Role) -> BatchRules:
        return self._prefill if role is Role.PREFILL else self._decode

    def on_arrival(self, req: Request, now: float,
                   workers: Sequence[WorkerState]) -> list[Assignment]:
        decode = least_loaded_of(workers, (Role.MULTIPLEX,))
        if decode is not None and decode.prompt_split(req)[0] <= self.local_limit:
            return [Assignment(req, decode.id, PrefillPath.COLOCATED,
                               f"conditional disaggregation: at most {self.local_limit} tokens uncached "
                               "on the decode worker")]
        prefill = lowest_cost(req, workers, (Role.PREFILL,), self.weight)
        if prefill is not None:
            return [Assignment(req, prefill.id, PrefillPath.PREFILL_WORKER, "lowest KV-router cost")]
        if decode is None:
            raise RuntimeError("no live worker takes new requests")
        return [Assignment(req, decode.id, PrefillPath.COLOCATED, "no live prefill worker")]
