"""The fleet's load index (sched.load_index) stays exact through everything that moves a load:
prompts queued, prefilled and aborted, decodes run (booked at once or lazily), KV landing, deaths,
revivals and role changes. After every step, each walk by load from the index gives exactly the
order a look at every worker would."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request, migrate_in, start_decoding
from tests.sched.test_prefix_cache import BLOCK, keys, prefixed
from tests.sched.test_scale_indexes import LABELS
from tropical.sched import load_index
from tropical.sched.admission import admission_error
from tropical.sched.baselines import DisaggPolicy
from tropical.sched.cluster import Cluster
from tropical.sched.dispatch import ARRIVAL_ROLES, DECODING_ROLES, NewTokenFloors, by_load, least_work
from tropical.sched.fleet import worker_states
from tropical.sched.lag import Lag
from tropical.sched.load_index import FIRST, LoadIndex, ascending, fleet_index
from tropical.sched.prediction import free_at
from tropical.sched.rules import BatchRules, Role, decodes
from tropical.sched.tropical import Roster, TropicalPolicy, earliest_finish
from tropical.sched.worker import WorkerState

WALKS = (tuple(Role), ARRIVAL_ROLES, DECODING_ROLES, (Role.PREFILL,), (Role.MULTIPLEX,))
PACE = 0.001


class LazyBooks:
    """A substrate that books decode runs lazily: each worker has run ``pending`` iterations not
    booked yet (never past its next finish), which grow with time without telling anyone once
    the run is announced (a positive ``pace``, as ``Cluster.expect_end`` sets it: ``PACE``
    unless the test set one, short enough that any count can have run by the clock, since a
    load floor assumes no iteration shorter than the pace)."""

    def __init__(self, workers: list[WorkerState]) -> None:
        self.workers = workers
        self.pending: dict[int, int] = {}
        self.lag = Lag(self.catch_up, lambda wid: self.pending.get(wid, 0), now=1.0)

    def catch_up(self, worker_id: int) -> None:
        steps = self.pending.pop(worker_id, 0)
        if steps:
            self.workers[worker_id].advance_decodes(steps, self.lag.now)

    def run_on(self, worker: WorkerState, rng: random.Random) -> None:
        if not worker.running:
            return
        if worker.pace <= 0.0:
            worker.pace = PACE
            worker.changed()
        room = worker._finishes[0][0] - worker._steps - self.pending.get(worker.id, 0)
        if room > 0:
            self.pending[worker.id] = self.pending.get(worker.id, 0) + rng.randint(1, room)


def exact_order(workers: list[WorkerState], roles: tuple[Role, ...]) -> list[int]:
    live = [w for w in workers if w.alive and w.role in roles]
    return [w.id for w in sorted(live, key=lambda w: (w.unfinished_tokens, w.id))]


def step(cluster: Cluster, books: LazyBooks | None, rng: random.Random, rid: int) -> None:
    """One random change to one worker, as the substrates and policies make them."""
    workers = cluster.workers
    worker = rng.choice(workers)
    op = rng.randrange(8)
    if op == 0:
        worker.enqueue(make_request(rid, prompt=rng.randrange(1, 900), output=rng.randrange(1, 60)))
    elif op == 1 and decodes(worker.role) and worker.alive:
        req = make_request(rid, prompt=rng.randrange(1, 300), output=rng.randrange(2, 60))
        if books is not None:
            books.catch_up(worker.id)
        if rng.random() < 0.5:
            start_decoding(worker, req)
        else:
            migrate_in(worker, req)
    elif op == 2 and worker.running:
        if books is not None:
            books.run_on(worker, rng)
        else:
            worker.advance_decodes(rng.randint(1, worker.steps_to_next_finish()), 1.0)
    elif op == 3:
        held = list(worker.waiting) + list(worker.running.values())
        if held:
            if books is not None:
                books.catch_up(worker.id)
            worker.abort(rng.choice(held))
    elif op == 4 and worker.alive and rng.random() < 0.3:
        cluster.worker_died(worker.id, 1.0)
    elif op == 5 and not worker.alive:
        cluster.worker_revived(worker.id, 1.0)
        if books is not None:
            books.pending.pop(worker.id, None)
    elif op == 6 and not worker.running and not worker.waiting:
        role = rng.choice([Role.PREFILL, Role.MULTIPLEX])
        worker.become(role, BatchRules())
    elif op == 7 and worker.waiting and worker.reserve(worker.waiting[0]):
        head = worker.waiting[0]
        worker.complete_prefill(head, rng.randint(1, head.remaining_prompt), now=1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([2, 5, 10, 40, 80]), st.booleans())
def test_every_walk_from_the_index_is_the_exact_order_of_a_full_look(seed, n, lazy):
    rng = random.Random(seed)
    roles = [Role.PREFILL, Role.MULTIPLEX] * (n // 2) + [Role.MULTIPLEX] * (n % 2)
    workers = worker_states(DisaggPolicy(512), roles, [(512, 16)] * n, [linear_model()] * n)
    cluster = Cluster(workers, DisaggPolicy(512), index_from=0)
    books = LazyBooks(cluster.workers) if lazy else None
    if books is not None:
        for w in cluster.workers:
            w.lag = books.lag
    index = cluster.index
    assert index is not None and fleet_index(cluster.workers) is index
    for rid in range(60):
        step(cluster, books, rng, rid)
        for w in cluster.workers:
            w.lag = None if books is None else books.lag
        for walk in WALKS:
            assert [w.id for w in by_load(cluster.workers, walk)] == exact_order(cluster.workers, walk)
            ids = index.live_ids(walk)
            assert index.load_floors(ids).tolist() == [cluster.workers[i].load_floor for i in ids]
            if books is None:  # a worker booked at once is filed at its exact load
                assert [wid for _, wid in index.ordered(walk)] == exact_order(cluster.workers, walk)
        req = make_request(10_000 + rid, prompt=rng.randrange(1, 900))
        full = [w for w in cluster.workers if w.alive]
        expected = min(full, key=lambda w: (w.unfinished_tokens + w.prompt_split(req)[0], w.id), default=None)
        assert least_work(req, cluster.workers, tuple(Role)) is expected


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3 * FIRST), st.integers(1, 5), st.integers(0, 10_000), st.sampled_from([int, float]))
def test_a_walk_in_order_of_bounds_is_sorted_by_bound_then_id_however_many_tie(n, distinct, seed, kind):
    """Bounds drawn from a few values (whole load floors, some below zero, or times), so that
    many workers tie with the last of the first ``FIRST`` (an idle fleet ties them all at no
    load)."""
    rng = random.Random(seed)
    values = [kind(rng.randrange(-1, distinct)) for _ in range(n)]
    ids = np.array(sorted(rng.sample(range(10 * n), n)))
    walked = list(ascending(np.array(values), ids))
    assert walked == sorted(zip(values, ids.tolist(), strict=True))


def test_a_part_of_the_fleet_is_walked_without_the_index():
    workers = worker_states(DisaggPolicy(512), [Role.PREFILL, Role.DECODE], [(64, 16)] * 2,
                            [linear_model()] * 2)
    index = LoadIndex.over(workers)
    assert fleet_index(workers) is index
    assert fleet_index(workers[1:]) is None
    assert fleet_index([]) is None


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 5, 10, 40]))
def test_path1_priced_from_the_index_chooses_what_a_full_look_would(seed, n):
    rng = random.Random(seed)
    policy = TropicalPolicy(512)
    workers = worker_states(policy, [Role.PREFILL] * n, [(512, 16)] * n, [linear_model()] * n,
                            prefix_cache=True)
    cluster = Cluster(workers, policy, index_from=0)
    for w in cluster.workers:  # most hold a first block, as every conversation's is shared
        if rng.random() < 0.7:
            history = prefixed(-1 - w.id, keys(rng.choice(LABELS), BLOCK * rng.randint(1, 3)), 3 * BLOCK)
            w.enqueue(history)
            w.reserve(history)
            w.complete_prefill(history, history.remaining_prompt, now=0.0)
    now = 0.0
    for rid in range(40):
        worker = rng.choice(cluster.workers)
        if rng.random() < 0.4:
            worker.busy_until = now + rng.choice([0.0, rng.uniform(0, 2)])
        elif rng.random() < 0.5:
            worker.enqueue(prefixed(rid, keys(rng.choice(LABELS), 2 * BLOCK), 2 * BLOCK))
        elif worker.waiting and worker.reserve(worker.waiting[0]):
            worker.complete_prefill(worker.waiting[0], worker.waiting[0].remaining_prompt, now=now)
        elif rng.random() < 0.2:
            cluster.worker_died(worker.id, now) if worker.alive else cluster.worker_revived(worker.id, now)
        now += rng.choice([0.0, rng.uniform(0, 1)])
        req = prefixed(10_000 + rid, keys(rng.choice(LABELS), 3 * BLOCK), 3 * BLOCK)
        live = [w for w in cluster.workers if w.alive]
        index = cluster.index
        assert index is not None
        ids = index.live_ids((Role.PREFILL,))
        assert list(zip(index.free_at(ids, now).tolist(), ids.tolist(), strict=True)) == [
            (free_at(w, now), w.id) for w in live]
        full = min(((free_at(w, now) + w.prefill_estimate(req), w.id) for w in live), default=None)
        best = earliest_finish(req, Roster.of(cluster.workers), now)
        assert (None if best is None else (best[1], best[0].id)) == full


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([2, 10, 80]))
def test_admission_asked_of_the_index_answers_as_a_look_at_every_worker(seed, n):
    rng = random.Random(seed)
    roles = [rng.choice([Role.PREFILL, Role.DECODE, Role.MULTIPLEX]) for _ in range(n)]
    pools = [(rng.choice([8, 64, 512]), 16) for _ in range(n)]
    workers = worker_states(DisaggPolicy(512), roles, pools, [linear_model()] * n)
    cluster = Cluster(workers, DisaggPolicy(512), index_from=0)
    for w in cluster.workers:
        if rng.random() < 0.6:
            cluster.worker_died(w.id, 0.0)
    for _ in range(20):
        req = make_request(prompt=rng.randrange(1, 9_000), output=rng.randrange(1, 2_000))
        assert admission_error(req, cluster.workers) == admission_error(req, list(cluster.workers))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([3, 12, 40]), st.sampled_from([0, 1_000]))
def test_the_index_bounds_each_worker_by_its_own_load_floor_at_any_clock(seed, n, asked):
    """Lazily booked decode runs of every pace (fast, slow) and workers with no run in flight
    (pace 0), iterations ended before the clock or not, each worker's or only part of the
    fleet's: the vector floors are the workers', worked out in vector form or asked of each
    worker behind its booking (``asked``: how many may be)."""
    with mock.patch.object(load_index, "_ASKED", asked):
        floors_at_every_clock(seed, n)


def floors_at_every_clock(seed: int, n: int) -> None:
    rng = random.Random(seed)
    roles = [rng.choice([Role.PREFILL, Role.MULTIPLEX, Role.DECODE]) for _ in range(n)]
    workers = worker_states(DisaggPolicy(512), roles, [(512, 16)] * n, [linear_model()] * n)
    cluster = Cluster(workers, DisaggPolicy(512), index_from=0)
    books = LazyBooks(cluster.workers)
    for rid, worker in enumerate(cluster.workers):
        worker.lag = books.lag
        for k in range(rng.randrange(3) if decodes(worker.role) else 0):
            start_decoding(worker, make_request(100 * rid + k, prompt=rng.randrange(1, 300),
                                                output=rng.randrange(2, 60)))
        worker.pace = rng.choice([0.0, 0.01, 0.2])
        worker.busy_until = rng.choice([0.0, 0.9, 2.0])
        if worker.pace > 0.0:
            books.run_on(worker, rng)
        worker.changed()
    index = cluster.index
    assert index is not None
    for now in (0.5, 0.9, 1.0, 2.0, 3.0):
        books.lag.now = now
        for walk in WALKS:
            ids = index.live_ids(walk)
            floors = [cluster.workers[i].load_floor for i in ids]
            assert index.load_floors(ids).tolist() == floors
            assert list(index.ordered(walk)) == sorted(zip(floors, ids.tolist(), strict=True))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([3, 5, 40]), st.sampled_from([0.0, 0.5, 1.0]))
def test_the_new_token_floors_of_the_fleet_are_each_workers_own(seed, n, share):
    """As a vector by worker id, priced or not, whatever share of the fleet holds the prompt's
    first block (every worker: a conversation's first block, once the fleet has served a few)."""
    rng = random.Random(seed)
    label = rng.choice(LABELS)
    kin = [other for other in LABELS if other[0] == label[0]]
    policy = TropicalPolicy(512)
    workers = worker_states(policy, [Role.MULTIPLEX] * n, [(512, 16)] * n, [linear_model()] * n,
                            prefix_cache=True)
    for w in workers:
        held = rng.choice(kin) if rng.random() < share else rng.choice(LABELS)
        history = prefixed(-1 - w.id, keys(held, BLOCK * rng.randint(1, 3)), 3 * BLOCK)
        w.enqueue(history)
        w.reserve(history)
        w.complete_prefill(history, history.remaining_prompt, now=0.0)
    floors = NewTokenFloors.of(prefixed(1, keys(label, 3 * BLOCK), 3 * BLOCK), workers)
    if share == 1.0:
        assert len(floors.levels[0][1]) == n
    assert floors.vector(n).tolist() == [floors.at(w) for w in workers]
    assert floors.vector(n, lambda tokens: tokens / 2).tolist() == [floors.at(w) / 2 for w in workers]


def test_each_arrival_and_iteration_end_leaves_the_index_up_to_date_with_what_it_changed():
    """The Cluster re-files the workers an event changed before the event returns, so that no
    later decision's walk pays for them; the rows are then each worker's own terms."""
    workers = worker_states(DisaggPolicy(512), [Role.PREFILL, Role.DECODE] * 2, [(512, 16)] * 4,
                            [linear_model()] * 4)
    cluster = Cluster(workers, DisaggPolicy(512), index_from=0)
    index = cluster.index
    n = len(workers)

    def filed() -> bool:
        return not index.marked and all(
            index.booked_keys[w.id] == w.booked_load()[0] * n + w.id
            and index.queued_work[w.id] == w.queued_work
            and index.block_size[w.id] == w.kv.block_size and index.live[w.id] == w.alive
            and load_index.ROLES[index.role[w.id]] is w.role for w in cluster.workers)

    for rid in range(6):
        cluster.arrive(make_request(rid, prompt=300 + 100 * rid, output=5), 0.01 * rid)
        assert filed()
    for now in (0.5, 1.0, 1.5):
        for worker in cluster.workers:
            batch = cluster.plan(worker.id, now)
            if batch is not None:
                cluster.book(worker.id, batch, now + 0.1)
                assert filed()


def test_a_worker_with_no_decode_run_in_flight_asks_its_substrate_nothing():
    """An iteration's booking ends what was in flight (``pace`` 0): reads of the worker during
    its own booking and round ask the substrate nothing and book nothing, and its index row
    holds no lazy batch; once a decode run is announced (``expect_end`` with a pace) and due,
    the same reads book what it ran."""
    workers = worker_states(DisaggPolicy(512), [Role.DECODE], [(512, 16)], [linear_model()])
    cluster = Cluster(workers, DisaggPolicy(512), index_from=0)
    worker = cluster.workers[0]
    books = LazyBooks(cluster.workers)
    asked: list[int] = []

    def catch_up(worker_id: int) -> None:
        asked.append(worker_id)
        books.catch_up(worker_id)

    worker.lag = books.lag = Lag(catch_up, books.lag.unbooked, now=1.0)
    start_decoding(worker, make_request(1, prompt=100, output=20))
    batch = cluster.plan(worker.id, 0.0)
    assert batch is not None
    cluster.expect_end(worker.id, 0.02, 0.02)
    cluster.book(worker.id, batch, 0.05)
    assert worker.pace == 0.0 and cluster.index is not None and cluster.index.batch[worker.id] == 0
    books.pending[worker.id] = 3
    steps = worker.steps
    assert (worker.busy_until, worker.unfinished_tokens, asked) == (0.05, 18, [])
    cluster.expect_end(worker.id, 0.07, 0.02)
    assert worker.steps == steps + 3 and asked == [worker.id]
