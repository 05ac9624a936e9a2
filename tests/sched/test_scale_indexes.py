"""What keeps a decision's cost flat as the fleet grows: the walks by load stop early yet choose
what a look at every worker would, the directory of prefix holders follows every cache exactly,
the toggle's role split follows deaths and revivals, and Path 2's shortlist keeps the workers
that matter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request
from tests.sched.test_prefix_cache import BLOCK, keys, prefixed
from tropical.core.request import Request
from tropical.sched.baselines import DisaggPolicy
from tropical.sched.cluster import Cluster
from tropical.sched.dispatch import by_load, decode_destination, exact_lead, has_room, least_work
from tropical.sched.fleet import worker_states
from tropical.sched.kv_router import kv_cost, lowest_cost
from tropical.sched.load_index import LoadIndex
from tropical.sched.prefix_cache import PrefixCache
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sched.tropical import SHORTLIST, Roster, Shortlists, ToggleParams
from tropical.sched.worker import WorkerState

LABELS = ["a", "ab", "abc", "b", "bc", "c"]
FLEETS = st.sampled_from([1, 5, 12, 40])
"""Fleet sizes: 40 is more workers than a walk from the load index sorts at first."""


def fleet(n: int, role: Role = Role.MULTIPLEX, kv_tokens: int = 4_096) -> list[WorkerState]:
    policy = make_policy("tropical+", PolicyParams())
    return worker_states(policy, [role] * n, [(kv_tokens // 16, 16)] * n, [linear_model()] * n,
                         prefix_cache=True)


def load(worker: WorkerState, rng: random.Random, rid: int) -> None:
    """Give ``worker`` some queued prompts (some sharing prefixes) and cache what they computed."""
    for i in range(rng.randrange(4)):
        prompt = rng.choice([BLOCK * 2, BLOCK * 3 + 5, 40])
        req = prefixed(rid * 100 + i, keys(rng.choice(LABELS), prompt), prompt)
        worker.enqueue(req)
        if rng.random() < 0.5 and worker.reserve(req):
            worker.complete_prefill(req, req.remaining_prompt, now=0.0)
            if rng.random() < 0.5:
                worker.abort(req)


def loaded_fleet(seed: int, n: int) -> list[WorkerState]:
    rng = random.Random(seed)
    workers = fleet(n, kv_tokens=rng.choice([1_024, 4_096]))
    for w in workers:
        load(w, rng, w.id + 1)
        w.alive = rng.random() > 0.1
    return workers


def holders_by_cache(workers: list[WorkerState]) -> dict[int, set[int]]:
    truth: dict[int, set[int]] = {}
    for w in workers:
        assert w.kv.cache is not None
        for key in w.kv.cache.entries:
            truth.setdefault(key, set()).add(w.id)
    return truth


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), FLEETS, st.sampled_from(LABELS), st.integers(1, 5 * BLOCK))
def test_least_work_walks_by_load_and_chooses_what_a_full_look_would(seed, n, label, prompt):
    workers = loaded_fleet(seed, n)
    req = prefixed(99_999, keys(label, prompt), prompt)
    live = [w for w in workers if w.alive]
    expected = min(live, key=lambda w: (w.unfinished_tokens + w.prompt_split(req)[0], w.id)) if live else None
    assert least_work(req, workers, tuple(Role)) is expected
    assert least_work(req, workers, tuple(Role), live) is expected
    LoadIndex.over(workers)
    assert least_work(req, workers, tuple(Role)) is expected


def test_the_least_bound_is_the_choice_only_when_its_cost_is_its_bound() -> None:
    """One pass settles a choice when the worker of least bound (lowest id on a tie) costs its
    bound; any other cost sends the choice to the heap walk (None), whatever the others cost."""
    a, b, c = fleet(3)
    costs = {a.id: 6.0, b.id: 5.0, c.id: 5.0}
    assert exact_lead([c, b, a], [5, 5, 6], lambda w: costs[w.id]) == (b, 5.0)
    costs[b.id] = 6.0
    assert exact_lead([c, b, a], [5, 5, 6], lambda w: costs[w.id]) is None
    assert exact_lead([], [], lambda w: 0.0) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), FLEETS)
def test_a_walk_by_load_among_the_live_workers_a_caller_keeps_is_the_walk_over_the_fleet(seed, n):
    workers = loaded_fleet(seed, n)
    for w in workers[::3]:
        w.role = Role.PREFILL
    live = [w for w in workers if w.alive and w.role is Role.MULTIPLEX]
    walked = list(by_load(workers, (Role.MULTIPLEX,)))
    assert walked == sorted(live, key=lambda w: (w.unfinished_tokens, w.id))
    assert list(by_load(workers, (Role.MULTIPLEX,), live)) == walked


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), FLEETS, st.sampled_from(LABELS), st.integers(1, 5 * BLOCK),
       st.sampled_from([1.0, 64.0]))
def test_the_kv_router_prices_from_the_lowest_bound_and_chooses_what_a_full_look_would(
        seed, n, label, prompt, weight):
    workers = loaded_fleet(seed, n)
    req = prefixed(99_999, keys(label, prompt), prompt)
    live = [w for w in workers if w.alive]
    expected = min(live, key=lambda w: (kv_cost(req, w, weight), w.id)) if live else None
    assert lowest_cost(req, workers, tuple(Role), weight) is expected
    LoadIndex.over(workers)
    assert lowest_cost(req, workers, tuple(Role), weight) is expected


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(1, 3_000))
def test_decode_destination_is_the_least_loaded_with_room(seed, n, prompt):
    workers = loaded_fleet(seed, n)
    req = make_request(99_999, prompt=prompt, output=50)
    room = [w for w in workers if w.alive and has_room(req, w)]
    expected = min(room, key=lambda w: (w.unfinished_tokens, w.id)) if room else None
    assert decode_destination(req, workers) is expected
    LoadIndex.over(workers)
    assert decode_destination(req, workers) is expected


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(3, 6))
def test_the_directory_holds_exactly_what_every_cache_holds(seed, n):
    """(A toggle's fleet of two multiplexing workers or fewer keeps none: ``keeps_directory``.)"""
    workers = loaded_fleet(seed, n)
    cache = workers[0].kv.cache
    assert cache is not None and cache.directory is not None
    assert cache.directory.holders == holders_by_cache(workers)
    for label in LABELS:
        req = prefixed(99_999, keys(label, 5 * BLOCK), 5 * BLOCK)
        runs = cache.directory.runs(req)
        for w in workers:
            assert w.kv.cache is not None
            held = [key in w.kv.cache.entries for key in req.prefix] + [False]
            assert runs.get(w.id, 0) == held.index(False)
    for w in workers:
        assert w.kv.cache is not None
        w.kv.cache.clear()
    assert cache.directory.holders == holders_by_cache(workers)


def test_the_directory_follows_forgotten_keys_and_a_revived_worker_starts_empty():
    workers = fleet(3)
    cluster = Cluster(workers, DisaggPolicy(512))
    for w in workers:
        load(w, random.Random(w.id), w.id + 1)
    first = workers[0].kv.cache
    assert isinstance(first, PrefixCache) and first.directory is not None
    unreferenced = [k for k, e in first.entries.items() if e.refs == 0]
    first.forget(unreferenced)
    assert first.directory.holders == holders_by_cache(cluster.workers)
    cluster.worker_died(1, 0.0)
    cluster.worker_revived(1, 0.0)
    assert all(1 not in held for held in first.directory.holders.values())
    assert first.directory.holders == holders_by_cache(cluster.workers)


def test_the_toggle_splits_roles_anew_after_a_death_and_a_revival():
    policy = make_policy("tropical+", PolicyParams())
    workers = worker_states(policy, policy.roles(4), [(4_096, 16)] * 4, [linear_model()] * 4)
    cluster = Cluster(workers, policy)

    def serving() -> list[WorkerState]:
        cluster.arrive(make_request(len(cluster.workers) * 10, prompt=200, output=5, ttft=100.0), 0.0)
        prefill, multiplex = policy._split(cluster.workers)
        return prefill + multiplex

    assert serving() == cluster.workers
    cluster.worker_died(0, 0.0)
    assert [w.id for w in serving()] == [1, 2, 3]
    cluster.worker_revived(0, 0.0)
    assert all(a is b for a, b in zip(serving(), cluster.workers, strict=True))


def test_the_shortlist_is_everyone_up_to_its_size_then_the_least_loaded_and_the_prefix_holders():
    small = fleet(SHORTLIST)
    req = prefixed(1, keys("abc", 3 * BLOCK), 3 * BLOCK)
    assert Shortlists(Roster.of(small)).of(req) == small
    workers = fleet(4 * SHORTLIST)
    rng = random.Random(3)
    for w in workers[1:]:
        w.enqueue(make_request(1_000 + w.id, prompt=rng.randrange(100, 5_000)))
    holder = workers[-1]
    history = prefixed(2_000, keys("abc", 3 * BLOCK), 3 * BLOCK)
    holder.enqueue(history)
    assert holder.reserve(history)
    holder.complete_prefill(history, history.remaining_prompt, now=0.0)
    picked = Shortlists(Roster.of(workers)).of(req)
    assert len(picked) == SHORTLIST and len({w.id for w in picked}) == SHORTLIST
    assert workers[0] in picked and holder in picked
    least = sorted(workers, key=lambda w: (w.unfinished_tokens, w.id))[:SHORTLIST // 2]
    assert all(w in picked for w in least)
    LoadIndex.over(workers)
    assert Shortlists(Roster.of(workers)).of(req) == picked


def sharing_fleet(seed: int, n: int, shared: float, indexed: bool) -> list[WorkerState]:
    """``loaded_fleet`` with a ``shared`` part of it holding the prefix ``z`` (a first block every
    conversation has), indexed or not."""
    workers = loaded_fleet(seed, n)
    rng = random.Random(seed)
    for w in workers:
        if rng.random() < shared:
            history = prefixed(50_000 + w.id, keys("z", BLOCK), BLOCK)
            w.enqueue(history)
            if w.reserve(history):
                w.complete_prefill(history, history.remaining_prompt, now=0.0)
    if indexed:
        LoadIndex.over(workers)
    return workers


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.sampled_from([2, 4, 6, 16]), indexed=st.booleans())
def test_a_shortlist_of_any_size_is_its_half_of_holders_then_the_least_loaded(seed: int, size: int,
                                                                              indexed: bool):
    """``--shortlist`` sets how many multiplexing workers Path 2 prices: half of them the least
    loaded holders of the prompt's prefix, the rest the least loaded of the others."""
    workers = sharing_fleet(seed, 40, 0.3, indexed)
    req = prefixed(99_000, keys("z", 3 * BLOCK), 3 * BLOCK)
    order = sorted((w for w in workers if w.alive), key=lambda w: (w.unfinished_tokens, w.id))
    holders = workers[0].kv.cache.directory.deepest_holders(req)
    near = [w for w in order if w.id in holders][:size // 2]
    rest = [w for w in order if w not in near][:size - len(near)]
    assert Shortlists(Roster.of(workers), size).of(req) == near + rest


def test_a_shortlist_shorter_than_two_workers_is_refused():
    with pytest.raises(ValueError, match="shortlist must be at least 2 workers, got 1"):
        ToggleParams(shortlist=1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.sampled_from([20, 40, 70]), shared=st.floats(0.0, 1.0),
       indexed=st.booleans())
def test_every_shortlist_of_a_decision_is_the_least_loaded_holders_then_the_least_loaded(
        seed: int, n: int, shared: float, indexed: bool):
    """One walk by load serves every prompt of a decision, holders read off it or (when it meets
    too few of them) found by a heap: either way, what sorting every worker would pick. A
    ``shared`` part of the fleet holds the prefix ``z`` (a first block every conversation has)."""
    workers = sharing_fleet(seed, n, shared, indexed)
    shortlists = Shortlists(Roster.of(workers))
    live = [w for w in workers if w.alive]
    order = sorted(live, key=lambda w: (w.unfinished_tokens, w.id))
    directory = workers[0].kv.cache.directory
    for label in [*LABELS, "z"]:
        req = prefixed(99_000, keys(label, 3 * BLOCK), 3 * BLOCK)
        holders = directory.deepest_holders(req)
        near = [w for w in order if w.id in holders][:SHORTLIST // 2]
        rest = [w for w in order if w not in near][:SHORTLIST - len(near)]
        assert shortlists.of(req) == (live if len(live) <= SHORTLIST else near + rest)


def test_a_request_without_prefix_blocks_has_no_holders():
    workers = fleet(3)
    cache = workers[0].kv.cache
    assert cache is not None and cache.directory is not None
    assert cache.directory.deepest_holders(Request(1, 0.0, 100, 1, make_request().slo)) == set()
