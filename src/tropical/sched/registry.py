"""Policies by name, so the CLI, the simulator and the server build them the same way."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tropical.sched.baselines import ColocatedPolicy, DisaggPolicy
from tropical.sched.kv_router import OVERLAP_WEIGHT, KVRouterDisaggPolicy, KVRouterPolicy
from tropical.sched.policy import Policy
from tropical.sched.pools import PooledPolicy
from tropical.sched.rejection import Admission, AdmissionMode
from tropical.sched.slack import SlackRule
from tropical.sched.tropical import ToggleParams, TropicalPolicy


@dataclass(frozen=True, slots=True)
class PolicyParams:
    """Knobs shared by the policies; each uses the ones that apply to it (the role split in
    ``toggle`` serves disagg too); ``admission`` applies to all."""

    max_batched_tokens: int = 4096
    chunk_budget: int = 2048
    max_seqs: int = 256
    toggle: ToggleParams = field(default_factory=ToggleParams)
    kv_overlap_weight: float = OVERLAP_WEIGHT
    admission: AdmissionMode = AdmissionMode.NONE


CHUNK_SIZES = (512, 1024, 2048)
"""Sarathi-Serve's budgets: ``chunked-512`` … are the chunked baseline at a fixed budget."""
DISAGG_SPLIT = re.compile(r"disagg-([1-9][0-9]*)p")
"""``disagg-3p``: the disaggregated baseline with 3 prefill workers (``disagg``: half), DistServe's
xPyD, so that a study can give the baseline the split that suits its setting."""
POOLED = re.compile(r"(.+)/([1-9][0-9]*)pools")
"""``tropical+/16pools``: the fleet sharded into 16 pools, each with its own policy, behind a
cache- and load-aware front router (``sched.pools``)."""


KV_ROUTER_CHUNK = 512
PLUS_PREFILL_BUDGET = 1024
"""``tropical+``'s prefill workers batch at most this many prompt tokens per iteration (a lone
longer prompt runs alone): prefill is compute-bound, so a bigger batch gains little throughput
but holds its short, tight prompts until the batch ends (docs/overload.md measures it)."""


def _paper_toggle(toggle: ToggleParams) -> ToggleParams:
    """The paper's toggle: demotion only when asked for."""
    return replace(toggle, demote_doomed=bool(toggle.demote_doomed))


PLUS_PREFILL_PIECE = 4096
"""``tropical+``'s prefill workers run a longer prompt in pieces of at most this many tokens,
queuing its rest again by its key after each (preemption at piece boundaries): about half a
second a piece on the paper cluster, and under 2% more compute than the whole prompt, where
1,024-token chunks cost up to 10% more (docs/overload.md measures 4,096 to 16,384)."""


PLUS_MECHANISMS: dict[str, Any] = {"chunked": True, "laxity": True, "least_loaded": True}
"""What ``tropical+`` always adds to the paper's toggle (with the per-iteration slack rule)."""
PLUS_SIZE_WEIGHT = 2.0
"""``tropical+``'s queue key: a prompt's TTFT deadline plus twice its predicted prefill, so that
among prompts with near deadlines the shorter go first (the paper's laxity order is -1, earliest
deadline first 0; docs/overload.md measures -1 to 4 on three traces)."""
PLUS_DEFAULTS: dict[str, Any] = {"demote_doomed": True, "prefill_budget": PLUS_PREFILL_BUDGET,
                                 "spare_finishing": True, "placed_dispatch": True,
                                 "size_weight": PLUS_SIZE_WEIGHT, "prefill_piece": PLUS_PREFILL_PIECE,
                                 "shorter_first": True, "iteration_cap": True, "joining_decodes": True}
"""What ``tropical+`` adds unless its flags say otherwise."""


def _plus_toggle(toggle: ToggleParams) -> ToggleParams:
    """``tropical+``: ``PLUS_MECHANISMS`` always, each of ``PLUS_DEFAULTS`` where unset."""
    unset = {k: v for k, v in PLUS_DEFAULTS.items() if getattr(toggle, k) is None}
    return replace(toggle, slack=SlackRule.ITERATION, **PLUS_MECHANISMS, **unset)


def _kv_router_name(size: int) -> str:
    return "kv-router" if size == KV_ROUTER_CHUNK else f"kv-router-{size}"


def _kv_router_at(size: int) -> Callable[[PolicyParams], Policy]:
    """Dynamo's KV router over chunked workers at chunk budget ``size`` (``kv-router``: 512)."""
    return lambda p: KVRouterPolicy(size, p.max_seqs, p.kv_overlap_weight, _kv_router_name(size))


def _chunked_at(size: int) -> Callable[[PolicyParams], Policy]:
    """The chunked baseline's factory with its chunk budget fixed at ``size``."""
    return lambda p: ColocatedPolicy(p.max_batched_tokens, chunked=True, chunk_budget=size,
                                     max_seqs=p.max_seqs, name=f"chunked-{size}")


_FACTORIES: dict[str, Callable[[PolicyParams], Policy]] = {
    "colocated": lambda p: ColocatedPolicy(p.max_batched_tokens, max_seqs=p.max_seqs),
    "chunked": lambda p: ColocatedPolicy(p.max_batched_tokens, chunked=True,
                                         chunk_budget=p.chunk_budget, max_seqs=p.max_seqs),
    **{f"chunked-{size}": _chunked_at(size) for size in CHUNK_SIZES},
    "disagg": lambda p: DisaggPolicy(p.max_batched_tokens, p.toggle.num_prefill, p.max_seqs),
    **{_kv_router_name(size): _kv_router_at(size) for size in CHUNK_SIZES},
    "kv-router-disagg": lambda p: KVRouterDisaggPolicy(p.max_batched_tokens, KV_ROUTER_CHUNK,
                                                       p.toggle.num_prefill, p.max_seqs,
                                                       p.kv_overlap_weight),
    "tropical": lambda p: TropicalPolicy(p.max_batched_tokens, _paper_toggle(p.toggle), p.max_seqs),
    "tropical+": lambda p: TropicalPolicy(p.max_batched_tokens, _plus_toggle(p.toggle), p.max_seqs,
                                          name="tropical+"),
}


def policy_names() -> list[str]:
    """The registered names (``disagg-<k>p`` names the disagg baseline at any split as well)."""
    return list(_FACTORIES)


def make_policy(name: str, params: PolicyParams | None = None) -> Policy:
    """A fresh policy object (policies hold per-run state, so never share one between runs)."""
    params = params or PolicyParams()
    policy = _policy(name, params)
    policy.admission = Admission(params.admission)
    return policy


def _policy(name: str, params: PolicyParams) -> Policy:
    if pooled := POOLED.fullmatch(name):
        return PooledPolicy([_policy(pooled.group(1), params) for _ in range(int(pooled.group(2)))], name)
    if split := DISAGG_SPLIT.fullmatch(name):
        return DisaggPolicy(params.max_batched_tokens, int(split.group(1)), params.max_seqs, name=name)
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(_FACTORIES)} "
                         "or disagg-<k>p (k prefill workers), each also as <policy>/<n>pools") from None
    return factory(params)
