"""A worker's prefix cache: shared blocks, hits capped below the prompt, eviction that spares
referenced blocks, and migrations that move only the blocks the target lacks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model
from tropical.core.request import Request
from tropical.core.slo import SLO
from tropical.sched.baselines import DisaggPolicy
from tropical.sched.cluster import Cluster, Migrate
from tropical.sched.host_store import HostStore
from tropical.sched.kv import KVPool
from tropical.sched.prefix_cache import PrefixCache
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState

BLOCK = 64
"""Prompt tokens per prefix key in these tests: four KV blocks of 16."""


def keys(label: str, prompt: int) -> tuple[int, ...]:
    """Chained keys of a prompt whose tokens are named by ``label``: block i's key stands for
    label[:i+1] and the block's length (a partial last block is other tokens than a full one)."""
    return tuple(hash((label[:i + 1], min(BLOCK, prompt - i * BLOCK))) for i in range(-(-prompt // BLOCK)))


def prefixed(rid: int, prefix: Sequence[int], prompt: int, output: int = 2) -> Request:
    return Request(rid, 0.0, prompt, output, SLO(1.0, 0.1), prefix=tuple(prefix), prefix_block=BLOCK)


def filler(rid: int, blocks: int) -> Request:
    """A request without a prefix whose KV is exactly ``blocks`` blocks."""
    return prefixed(rid, (), blocks * 16, output=1)


def cached_worker(role: Role = Role.COLOCATED, rules: BatchRules | None = None, kv_tokens: int = 100_000,
                  wid: int = 0) -> WorkerState:
    return WorkerState(wid, role, rules or BatchRules(), KVPool.for_tokens(kv_tokens, prefix_cache=True),
                       linear_model())


def cache_of(worker: WorkerState) -> PrefixCache:
    assert worker.kv.cache is not None
    return worker.kv.cache


def serve(worker: WorkerState, req: Request) -> Request:
    """Queue, reserve, prefill and decode ``req`` to its end on a colocated ``worker``."""
    worker.enqueue(req)
    assert worker.reserve(req)
    worker.complete_prefill(req, req.remaining_prompt, now=0.0)
    if req.finish is None:
        worker.advance_decodes(worker.steps_to_next_finish(), now=1.0)
    assert req.finish is not None
    return req


def test_a_request_with_more_prefix_blocks_than_its_prompt_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="3 prefix blocks of 64 tokens"):
        prefixed(0, (1, 2, 3), prompt=2 * BLOCK)
    assert len(prefixed(1, (1, 2, 3), prompt=2 * BLOCK + 1).prefix) == 3


@pytest.mark.parametrize(("prompt", "hit"), [(2 * BLOCK, 2 * BLOCK - 16), (2 * BLOCK + 1, 2 * BLOCK),
                                             (BLOCK + 36, BLOCK + 32), (16, 0)])
def test_a_hit_leaves_the_block_of_the_last_prompt_token_to_compute(prompt: int, hit: int) -> None:
    worker = cached_worker()
    serve(worker, prefixed(0, keys("ab", prompt), prompt))
    again = prefixed(1, keys("ab", prompt), prompt)
    assert worker.hit(again) == hit and worker.prompt_split(again) == (prompt - hit, hit)
    worker.enqueue(again)
    assert again.computed == again.cached == hit and again.remaining_prompt >= 1


@pytest.mark.parametrize("i", range(5))
def test_prompts_that_differ_in_block_i_share_nothing_from_block_i_on(i: int) -> None:
    worker = cached_worker()
    prompt = 4 * BLOCK + 10
    first = serve(worker, prefixed(0, keys("abcde", prompt), prompt))
    second = prefixed(1, keys("abcde"[:i] + "xyzvw"[i:], prompt), prompt)
    assert first.prefix[:i] == second.prefix[:i] and not set(first.prefix[i:]) & set(second.prefix[i:])
    assert worker.hit(second) == i * BLOCK
    worker.enqueue(second)
    assert worker.reserve(second) and cache_of(worker).refs[second.id] == list(first.prefix[:i])


@pytest.mark.parametrize("i", range(4))
def test_the_hit_is_the_run_of_cached_blocks_up_to_the_first_miss(i: int) -> None:
    """Only block i differs (the later keys are the first prompt's): a cached block after a miss
    is other tokens' KV under a chained hash, never part of the hit."""
    worker = cached_worker()
    prompt = 4 * BLOCK + 10
    first = serve(worker, prefixed(0, keys("abcde", prompt), prompt))
    second = prefixed(1, first.prefix[:i] + (-1,) + first.prefix[i + 1:], prompt)
    assert worker.hit(second) == i * BLOCK
    worker.enqueue(second)
    assert second.computed == i * BLOCK and worker.reserve(second)
    assert cache_of(worker).refs[second.id] == list(first.prefix[:i])


def test_eviction_takes_the_least_recently_freed_tail_first_and_never_a_pinned_block() -> None:
    worker = cached_worker(kv_tokens=32 * 16)
    cache = cache_of(worker)
    head, middle, tail = serve(worker, prefixed(0, keys("abc", 3 * BLOCK), 3 * BLOCK)).prefix
    assert worker.kv.used_blocks == 0 and cache.free_blocks == 12
    pinned = prefixed(1, keys("ax", 2 * BLOCK), 2 * BLOCK, output=2)
    worker.enqueue(pinned)
    assert pinned.cached == BLOCK and worker.reserve(pinned)     # head + 5 own blocks
    [later] = serve(worker, prefixed(2, keys("y", BLOCK), BLOCK, output=1)).prefix
    assert worker.kv.used_blocks == 9 and cache.free_blocks == 12
    assert worker.reserve(filler(3, 15))                          # 4 cached blocks must go
    assert set(cache.entries) == {head, middle, later}
    assert worker.reserve(filler(4, 8))
    assert set(cache.entries) == {head} and cache.entries[head].refs == 1
    assert not worker.reserve(filler(5, 1))
    assert set(cache.entries) == {head} and cache.free_blocks == 0
    assert worker.kv.used_blocks == worker.kv.capacity_blocks


def test_a_finished_request_frees_its_blocks_but_they_still_serve_hits() -> None:
    worker = cached_worker()
    first = serve(worker, prefixed(0, keys("abc", 3 * BLOCK + 5), 3 * BLOCK + 5))
    assert worker.kv.used_blocks == 0 and cache_of(worker).free_blocks == 12
    assert worker.can_hold(first) and worker.hit(prefixed(1, first.prefix, first.prompt_len)) == 3 * BLOCK


def disagg_with_caches() -> Cluster:
    """One prefill worker (0) and one decode worker (1), both caching."""
    policy = DisaggPolicy(4096, num_prefill=1)
    return Cluster([cached_worker(Role.PREFILL, policy.rules(Role.PREFILL), wid=0),
                    cached_worker(Role.DECODE, policy.rules(Role.DECODE), wid=1)], policy)


def prefill_and_migrate(cluster: Cluster, req: Request, now: float) -> Migrate:
    cluster.arrive(req, now)
    batch = cluster.plan(0, now)
    assert batch is not None
    [move] = cluster.book(0, batch, now + 1.0).effects
    assert isinstance(move, Migrate)
    cluster.migrated(req, 0, 1)
    return move


def decode_once(cluster: Cluster, now: float) -> list[Request]:
    """One decode iteration on worker 1; the requests it finished."""
    batch = cluster.plan(1, now)
    assert batch is not None
    return [req for req, _ in cluster.book(1, batch, now + 0.1).finished]


def test_a_migration_moves_only_the_prompt_blocks_the_target_lacks() -> None:
    cluster = disagg_with_caches()
    prompt = 4 * BLOCK + 10
    first = prefixed(0, keys("abcde", prompt), prompt)
    assert prefill_and_migrate(cluster, first, 0.0).tokens == prompt
    assert decode_once(cluster, 2.0) == [first]
    second = prefixed(1, keys("abxyz", prompt), prompt)
    assert cluster.workers[1].hit(second) == 2 * BLOCK
    move = prefill_and_migrate(cluster, second, 3.0)
    assert second.cached == 2 * BLOCK                               # the prefill worker's own hit
    assert move == Migrate(second, 0, 1, prompt - 2 * BLOCK)
    decoder = cache_of(cluster.workers[1])
    assert decoder.refs[second.id] == list(second.prefix[:4]) and second.prefix[2] in decoder.entries


def test_a_migration_target_pins_the_prefix_it_counted_on() -> None:
    """The blocks a migration skips must stay on the target until the request leaves, even when
    room is needed before its KV lands."""
    cluster = disagg_with_caches()
    decoder = cluster.workers[1]
    prompt = 4 * BLOCK
    first = prefixed(0, keys("abcd", prompt), prompt)
    prefill_and_migrate(cluster, first, 0.0)
    assert decode_once(cluster, 2.0) == [first]
    second = prefixed(1, keys("abxy", prompt), prompt)
    tokens = decoder.expect_migration(second)
    assert tokens == prompt - 2 * BLOCK
    free = decoder.kv.capacity_blocks - decoder.kv.used_blocks
    assert decoder.reserve(filler(2, free))
    assert set(second.prefix[:2]) <= set(cache_of(decoder).entries)


LABELS = st.text("ab", min_size=4, max_size=4)
Step = tuple[str, int, int, str, bool]
"""An operation, a prompt length (or chunk), an output length (or pick), a label, a flag."""
STEPS = st.lists(st.tuples(st.sampled_from(["arrive", "migrate", "reserve", "prefill", "decode", "abort"]),
                           st.integers(1, 4 * BLOCK), st.integers(1, 8), LABELS, st.booleans()),
                 max_size=40)


def assert_consistent(worker: WorkerState, live: dict[int, Request]) -> None:
    """The pool's counts agree with the holds and the cache's references after any step."""
    kv, cache = worker.kv, cache_of(worker)
    referenced = Counter(key for held in cache.refs.values() for key in held)
    assert set(cache.refs) <= set(live) and set(worker.holds) <= set(live)
    assert set(referenced) <= set(cache.entries), "a block a live request references was evicted"
    assert all(entry.refs == referenced[key] for key, entry in cache.entries.items())
    order = cache.eviction_order()
    assert len(order) == len(set(order)), "a block queued twice for eviction"
    assert set(order) == {key for key, entry in cache.entries.items() if entry.refs == 0}
    assert cache.free_blocks == sum(e.blocks for e in cache.entries.values() if e.refs == 0)
    assert kv.used_blocks == (sum(worker.holds.values())
                              + sum(e.blocks for e in cache.entries.values() if e.refs))
    assert kv.used_blocks + cache.free_blocks <= kv.capacity_blocks
    assert all(cache.held_tokens(live[rid]) == sum(cache.entries[k].blocks for k in held) * kv.block_size
               for rid, held in cache.refs.items())
    for rid, blocks in worker.holds.items():
        assert blocks * kv.block_size + cache.held_tokens(live[rid]) >= worker.kv_tokens_needed(live[rid])
    if cache.host is not None:
        assert cache.host.held == sum(cache.host.keys.values()) <= cache.host.capacity


@pytest.mark.parametrize("host", [0, 48], ids=["pool only", "host tier"])
@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_kv_accounting_holds_under_any_sequence_of_requests(host: int, steps: list[Step]) -> None:
    worker = cached_worker(kv_tokens=32 * 16)
    if host:
        worker.add_host_tier(HostStore(host), 1e-6)
    live: dict[int, Request] = {}
    for rid, (op, prompt, output, label, flag) in enumerate(steps):
        if op in ("arrive", "migrate"):
            req = prefixed(rid, keys(label, prompt), prompt, output + (op == "migrate"))
            if worker.can_hold(req):
                live[rid] = req
                if op == "arrive":
                    worker.enqueue(req)
                    assert req.computed == req.cached <= (prompt - 1) // 16 * 16
                    assert not flag or worker.reserve(req)
                else:
                    req.computed, req.generated, req.first_token = prompt, 1, 0.0
                    cached = cache_of(worker).lookup(req)
                    assert worker.expect_migration(req) == prompt - cached
                    worker.arrive_migrated(req)
                    worker.admit_inbox()
        elif op == "reserve":
            for req in worker.waiting:
                worker.reserve(req)
        elif op == "prefill" and worker.waiting:
            req = worker.waiting[output % len(worker.waiting)]
            if worker.reserve(req):
                worker.complete_prefill(req, min(req.remaining_prompt, prompt), now=float(rid))
        elif op == "decode" and worker.running:
            worker.advance_decodes(worker.steps_to_next_finish(), now=float(rid))
        elif op == "abort" and live:
            req = list(live.values())[output % len(live)]
            worker.abort(req)
            req.finish = float(rid)
        live = {r.id: r for r in live.values() if r.finish is None}
        assert_consistent(worker, live)
    for req in live.values():
        worker.abort(req)
    assert_consistent(worker, {})
    assert worker.kv.used_blocks == 0
    cache_of(worker).clear()
    assert not cache_of(worker).entries and cache_of(worker).free_blocks == 0


def test_a_queued_prompt_holds_no_cached_block_and_starts_with_the_hit_it_finds_then() -> None:
    """vLLM looks a prompt up when it schedules it: blocks evicted while it queued are
    recomputed, and its queue sums follow (``waiting_prompt`` counts every token left)."""
    worker = cached_worker(kv_tokens=10 * 16)
    prompt = 2 * BLOCK
    serve(worker, prefixed(0, keys("ab", prompt), prompt))
    again = prefixed(1, keys("ab", prompt), prompt, output=1)
    worker.enqueue(again)
    assert again.computed == prompt - 16 and worker.kv.used_blocks == 0      # found, not held
    other = filler(2, 10)
    assert worker.reserve(other)                                             # evicts both blocks
    worker.release(other)
    assert not cache_of(worker).entries and worker.reserve(again)
    assert again.computed == again.cached == 0 and worker.waiting_prompt == prompt
