"""A self-scheduled worker's mirror (``Cluster.observe``) books the same scheduling state as a
stepped worker (``Cluster.plan`` and ``Cluster.book``) that produced the same tokens."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.factories import linear_model, make_request, make_worker
from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.baselines import ColocatedPolicy, DisaggPolicy
from tropical.sched.cluster import Booking, Cluster, Migrate
from tropical.sched.policy import Policy
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState


@dataclass(frozen=True)
class Seen:
    """What the policy sees of a worker, and of its requests."""

    waiting: list[int]
    running: list[int]
    steps: int
    kv_used: int
    decode_context: int
    unfinished: int
    requests: list[tuple[int, float | None, int, float | None]]

    @classmethod
    def of(cls, worker: WorkerState, requests: list[Request]) -> Seen:
        return cls([r.id for r in worker.waiting], sorted(worker.running), worker.steps,
                   worker.kv.used_blocks, worker.decode_context, worker.unfinished_tokens,
                   [(r.id, r.first_token, worker.generated(r), r.finish) for r in requests])


def pair(policy: Policy, roles: list[Role]) -> tuple[Cluster, Cluster]:
    """Two identical clusters: one to step, one to observe."""
    def build() -> Cluster:
        return Cluster([make_worker(role, policy.rules(role), wid=i) for i, role in enumerate(roles)], policy)
    return build(), build()


def requests(*outputs: int) -> list[Request]:
    return [make_request(i, prompt=100 + 10 * i, output=out) for i, out in enumerate(outputs)]


def summary(booking: Booking) -> tuple[list[tuple[int, str]], list[int], list]:
    """A booking by request ids, so two clusters' bookings compare."""
    effects = [(type(e).__name__, getattr(e, "worker_id", None)) for e in booking.effects]
    return [(r.id, why) for r, why in booking.finished], [r.id for r in booking.prefilled], effects


def step(cluster: Cluster, worker_id: int, now: float, eos: tuple[int, ...] = ()) -> Booking:
    batch = cluster.plan(worker_id, now - 1.0)
    assert batch is not None
    return cluster.book(worker_id, batch, now, eos=eos)


def test_a_colocated_mirror_books_what_the_stepped_worker_booked_token_for_token() -> None:
    stepped, mirrored = pair(ColocatedPolicy(4096), [Role.COLOCATED])
    ours, theirs = requests(3, 5), requests(3, 5)
    for a, b in zip(ours, theirs, strict=True):
        stepped.arrive(a, 0.0)
        mirrored.arrive(b, 0.0)
    mirrored.replan(0, 0.0)
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        booked = step(stepped, 0, now)
        tokens = {r.id: stepped.workers[0].generated(r) for r in ours if r.first_token is not None}
        observed = mirrored.observe(0, now, tokens)
        assert summary(observed) == summary(booked), f"at {now}"
        assert Seen.of(mirrored.workers[0], theirs) == Seen.of(stepped.workers[0], ours), f"at {now}"
    assert all(r.finish == 5.0 for r in theirs[1:]) and theirs[0].finish == 3.0


def test_a_prefill_mirror_hands_off_as_a_stepped_prefill_does() -> None:
    stepped, mirrored = pair(DisaggPolicy(4096, num_prefill=1), [Role.PREFILL, Role.DECODE])
    a, b = requests(4)[0], requests(4)[0]
    stepped.arrive(a, 0.0)
    mirrored.arrive(b, 0.0)
    mirrored.replan(0, 0.0)
    booked, observed = step(stepped, 0, 1.0), mirrored.observe(0, 1.0, {0: 1})
    assert summary(observed) == summary(booked)
    assert observed.effects == [Migrate(b, 0, 1, b.prompt_len)]
    stepped.migrated(a, 0, 1)
    mirrored.migrated(b, 0, 1)
    for now in (2.0, 3.0, 4.0):
        booked = step(stepped, 1, now)
        observed = mirrored.observe(1, now, {0: stepped.workers[1].generated(a)})
        assert summary(observed) == summary(booked), f"at {now}"
        for i in (0, 1):
            seen = Seen.of(mirrored.workers[i], [b])
            assert seen == Seen.of(stepped.workers[i], [a]), f"worker {i} at {now}"
    assert b.finish == 4.0 and mirrored.where(0) is None


def test_an_early_end_is_booked_as_the_stepped_worker_books_an_eos() -> None:
    stepped, mirrored = pair(ColocatedPolicy(4096), [Role.COLOCATED])
    a, b = requests(8)[0], requests(8)[0]
    stepped.arrive(a, 0.0)
    mirrored.arrive(b, 0.0)
    step(stepped, 0, 1.0)
    mirrored.observe(0, 1.0, {0: 1})
    booked, observed = step(stepped, 0, 2.0, eos=(0,)), mirrored.observe(0, 2.0, {0: 2}, eos=(0,))
    assert summary(observed) == summary(booked) and summary(observed)[0] == [(0, "eos")]
    assert Seen.of(mirrored.workers[0], [b]) == Seen.of(stepped.workers[0], [a])


def test_the_iteration_count_follows_the_stream_furthest_ahead() -> None:
    _, mirrored = pair(ColocatedPolicy(4096), [Role.COLOCATED])
    a, b = requests(10, 10)
    mirrored.arrive(a, 0.0)
    mirrored.arrive(b, 0.0)
    mirrored.observe(0, 1.0, {0: 1, 1: 1})
    mirrored.observe(0, 2.0, {0: 4})
    worker = mirrored.workers[0]
    assert worker.steps == 3 and worker.generated(b) == 4, "every running request decodes in each iteration"
    mirrored.observe(0, 2.1, {1: 3})
    assert worker.steps == 3, "a stream behind the count does not move it back"


def test_between_events_the_mirror_plans_the_iteration_running_there() -> None:
    _, mirrored = pair(ColocatedPolicy(4096), [Role.COLOCATED])
    req = requests(4)[0]
    mirrored.arrive(req, 0.0)
    mirrored.replan(0, 0.5)
    worker = mirrored.workers[0]
    assert worker.batch_prefills == 1 and req.prefill_start == 0.5
    assert worker.busy_until == pytest.approx(0.5 + worker.latency.iteration_time(BatchShape.prefill(100)))


def test_a_request_the_worker_admitted_joins_even_when_the_mirror_pool_is_full() -> None:
    policy = ColocatedPolicy(4096)
    worker = make_worker(Role.COLOCATED, policy.rules(Role.COLOCATED), kv_tokens=160)
    cluster = Cluster([worker], policy)
    a, b = make_request(0, prompt=100, output=10), make_request(1, prompt=100, output=10)
    cluster.arrive(a, 0.0)
    cluster.arrive(b, 0.0)
    cluster.observe(0, 1.0, {0: 1, 1: 1})
    assert sorted(worker.running) == [0, 1]


def test_observed_streams_correct_the_online_predictor() -> None:
    policy = ColocatedPolicy(4096)
    worker = make_worker(Role.COLOCATED, policy.rules(Role.COLOCATED))
    worker.latency = online = OnlineLatency(linear_model())
    cluster = Cluster([worker], policy)
    req = make_request(0, prompt=1000, output=50)
    cluster.arrive(req, 0.0)
    cluster.replan(0, 0.0)
    predicted = online.iteration_time(BatchShape.prefill(1000))
    cluster.observe(0, 2 * predicted, {0: 1})
    assert online.prefill_scale > 1.0, "the prompt ran alone and took twice its prediction"
    decode = online.iteration_time(BatchShape.decode(1, 1005))
    cluster.observe(0, 2 * predicted + 10 * 2 * decode, {0: 11})
    assert online.decode_scale > 1.0, "ten decode iterations took twice their prediction"
