"""The prefix cache's host-memory tier: blocks the KV pool evicts wait there, still serve hits,
load back (priced, and charged once to the next iteration) when a request references them, and
leave for good least recently used first; a shared store serves every worker."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model
from tests.sched.test_prefix_cache import BLOCK, cache_of, cached_worker, filler, keys, prefixed, serve
from tropical.core.latency.iterations import prefill_time
from tropical.core.specs import A100_80GB, ReplicaSpec
from tropical.models import load_model_spec
from tropical.sched.batching import form_batch
from tropical.sched.chunk import Chunk
from tropical.sched.cluster import Cluster
from tropical.sched.dispatch import NewTokenFloors
from tropical.sched.host_store import HostStore
from tropical.sched.pending import Pending
from tropical.sched.prefix_directory import PrefixDirectory
from tropical.sched.registry import make_policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState, worker_state

LOAD_S = 1e-5
"""Seconds to load one token's KV from host memory in these tests."""


def tiered(host_blocks: int, kv_blocks: int = 16) -> WorkerState:
    worker = cached_worker(kv_tokens=kv_blocks * 16)
    worker.add_host_tier(HostStore(host_blocks), LOAD_S)
    return worker


def host_of(worker: WorkerState) -> HostStore:
    store = cache_of(worker).host
    assert store is not None
    return store


def host_keys(worker: WorkerState) -> list[Hashable]:
    return list(host_of(worker).keys)


def offloaded(worker: WorkerState, label: str = "ab", prompt: int = 2 * BLOCK) -> None:
    """Serve a prompt, then fill the whole pool so that its cached blocks go to host memory."""
    serve(worker, prefixed(90, keys(label, prompt), prompt))
    fill = filler(91, worker.kv.capacity_blocks)
    assert worker.reserve(fill)
    worker.release(fill)


def test_an_evicted_block_waits_in_host_memory_and_loads_back_when_a_request_references_it() -> None:
    worker = tiered(host_blocks=100)
    offloaded(worker)
    cache = cache_of(worker)
    prompt = 2 * BLOCK + 1
    again = prefixed(1, keys("ab", prompt), prompt)
    assert set(again.prefix[:2]) <= set(host_keys(worker)) and not set(again.prefix) & set(cache.entries)
    assert host_of(worker).held == 8 and worker.hit(again) == 2 * BLOCK
    assert worker.prefill_estimate(again) == pytest.approx(
        prefill_time(worker.latency, 1, 2 * BLOCK) + 2 * BLOCK * LOAD_S)
    worker.enqueue(again)
    assert again.cached == 2 * BLOCK and worker.reserve(again)
    assert cache.loaded_blocks == 8 and set(again.prefix[:2]) <= set(cache.entries)
    assert list(host_keys(worker)) == list(again.prefix[:2])              # a load copies
    assert worker.kv.used_blocks == 8 + worker.holds[again.id]
    assert worker.load_time(again) == 0.0                    # referenced: loaded
    assert worker.take_loads() == 2 * BLOCK and worker.take_loads() == 0


def test_the_next_batch_waits_for_the_loads_its_prompts_started() -> None:
    worker = tiered(host_blocks=100)
    worker.rules = BatchRules(token_budget=512, chunked=True)
    offloaded(worker)
    prompt = 2 * BLOCK + 1
    worker.enqueue(prefixed(1, keys("ab", prompt), prompt))
    batch = form_batch(worker)
    assert [new for _, new, _ in batch.prefills] == [1] and batch.loaded == 2 * BLOCK
    assert form_batch(worker).loaded == 0


def test_path2_prices_the_loads_a_prompt_waits_for() -> None:
    worker = tiered(host_blocks=100)
    offloaded(worker)
    prompt = 2 * BLOCK + 1
    turn = prefixed(1, keys("ab", prompt), prompt)
    pending = Pending().plus(turn, worker)
    assert pending.loads == pytest.approx(2 * BLOCK * LOAD_S) and pending.tokens == 1
    unloaded = Pending(pending.count, pending.tokens, pending.kv_new, pending.peak, pending.pairs,
                       pending.cached)
    chunk = Chunk(64, 0.05, 0.04, 0.01)
    assert chunk.finish(worker, pending, 1.0) == pytest.approx(chunk.finish(worker, unloaded, 1.0)
                                                               + 2 * BLOCK * LOAD_S)
    worker.enqueue(turn)
    assert worker.reserve(turn) and Pending().plus(turn, worker).loads == 0.0   # loaded


def test_a_prompt_that_does_not_fit_loads_nothing() -> None:
    worker = tiered(host_blocks=100)
    offloaded(worker)
    cache = cache_of(worker)
    hog = filler(2, 12)
    assert worker.reserve(hog)
    prompt = 2 * BLOCK + 1
    late = prefixed(3, keys("ab", prompt), prompt)
    assert not worker.can_hold(late) and not worker.reserve(late)
    assert cache.loaded_blocks == 0 and host_of(worker).held == 8 and worker.kv.used_blocks == 12


def test_host_memory_keeps_its_size_evicting_the_least_recently_stored_and_the_directory_follows() -> None:
    directory = PrefixDirectory()
    worker = worker_state(0, Role.COLOCATED, BatchRules(), 16, 16, linear_model(), True, directory)
    worker.add_host_tier(HostStore(4), LOAD_S)
    offloaded(worker, "aa", BLOCK)
    first = keys("aa", BLOCK)[0]
    assert list(host_keys(worker)) == [first] and 0 in directory.runs(prefixed(5, (first,), BLOCK))
    offloaded(worker, "bb", BLOCK)
    second = keys("bb", BLOCK)[0]
    assert list(host_keys(worker)) == [second] and host_of(worker).held == 4
    assert not directory.runs(prefixed(6, (first,), BLOCK))
    assert directory.runs(prefixed(7, (second,), BLOCK)) == {0: 1}


def test_a_shared_store_serves_every_worker_and_the_directory_lists_only_pools() -> None:
    directory, store = PrefixDirectory(), HostStore(100, shared=True)
    a, b = (worker_state(i, Role.COLOCATED, BatchRules(), 16, 16, linear_model(), True, directory)
            for i in range(2))
    for worker in (a, b):
        worker.add_host_tier(store, LOAD_S)
    offloaded(a)
    prompt = 2 * BLOCK + 1
    turn = prefixed(1, keys("ab", prompt), prompt)
    assert directory.runs(turn) == {} and b.hit(turn) == a.hit(turn) == 2 * BLOCK
    assert NewTokenFloors.of(turn, [a, b]).at(b) == 1
    b.enqueue(turn)
    assert b.reserve(turn) and b.take_loads() == 2 * BLOCK and a.take_loads() == 0
    assert directory.runs(turn) == {1: 2} and list(store.keys) == list(turn.prefix[:2])


LABELS = st.text("abc", min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), LABELS, st.booleans()), max_size=30), LABELS)
def test_floors_under_a_shared_store_never_exceed_the_tokens_a_worker_would_compute(
        served: list[tuple[int, str, bool]], label: str) -> None:
    directory, store = PrefixDirectory(), HostStore(24, shared=True)
    workers = [worker_state(i, Role.COLOCATED, BatchRules(), 24, 16, linear_model(), True, directory)
               for i in range(3)]
    for worker in workers:
        worker.add_host_tier(store, LOAD_S)
    for rid, (at, done, evict) in enumerate(served):
        prompt = len(done) * BLOCK
        serve(workers[at], prefixed(100 + rid, keys(done, prompt), prompt))
        if evict:
            cache_of(workers[at]).clear()
    prompt = len(label) * BLOCK + 5
    req = prefixed(0, keys(label, prompt), prompt)
    floors = NewTokenFloors.of(req, workers)
    for worker in workers:
        assert floors.at(worker) <= worker.prompt_split(req)[0]


def test_a_host_tier_needs_the_prefix_cache() -> None:
    worker = worker_state(0, Role.COLOCATED, BatchRules(), 16, 16, linear_model(), prefix_cache=False)
    with pytest.raises(ValueError, match="--prefix-cache on"):
        worker.add_host_tier(HostStore(10), LOAD_S)
    with pytest.raises(ValueError, match="at least 0 KV blocks"):
        HostStore(-1)


def test_a_revived_worker_keeps_an_empty_host_tier_of_the_same_size() -> None:
    policy = make_policy("chunked-512")
    workers = [cached_worker(rules=policy.rules(Role.COLOCATED), wid=i) for i in range(2)]
    for worker in workers:
        worker.add_host_tier(HostStore(40), LOAD_S)
    cluster = Cluster(workers, policy)
    offloaded(cluster.workers[1])
    cluster.worker_died(1, 1.0)
    cluster.worker_revived(1, 2.0)
    revived = cluster.workers[1]
    assert host_of(revived).capacity == 40 and not host_of(revived).keys
    assert revived.host_load_s == LOAD_S


def test_a_revived_worker_finds_the_shared_store_as_it_was() -> None:
    policy = make_policy("chunked-512")
    store = HostStore(40, shared=True)
    workers = [cached_worker(rules=policy.rules(Role.COLOCATED), wid=i) for i in range(2)]
    for worker in workers:
        worker.add_host_tier(store, LOAD_S)
    cluster = Cluster(workers, policy)
    offloaded(cluster.workers[1])
    cluster.worker_died(1, 1.0)
    cluster.worker_revived(1, 2.0)
    assert host_of(cluster.workers[1]) is store and store.held == 8


def test_a_replica_loads_each_token_over_every_gpus_pcie_link() -> None:
    spec = ReplicaSpec(load_model_spec("internlm2-20b"), A100_80GB, tp=2)
    assert spec.host_load_seconds_per_token == pytest.approx(
        spec.model.kv_bytes_per_token / (2 * 31.5e9))
