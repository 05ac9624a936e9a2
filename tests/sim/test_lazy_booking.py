"""Decode runs booked lazily (sched.lag): a worker read in the middle of a run shows exactly the
iterations completed by then, walks by load see exact loads, and no decision depends on when, or
whether, a worker was read."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.factories import linear_cluster, make_request
from tropical.core.request import Request
from tropical.sched.dispatch import least_loaded_first
from tropical.sched.policy import Assignment, Policy
from tropical.sched.registry import make_policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.worker import WorkerState
from tropical.sim.simulator import Simulator


class ReadsEveryWorker(Policy):
    """A policy that reads every worker's decode progress before each decision, as the old
    simulator booked every run before each decision; otherwise ``inner``."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.observes_iterations = inner.observes_iterations
        self.admission = inner.admission

    def roles(self, num_workers: int) -> list[Role]:
        return self.inner.roles(num_workers)

    def rules(self, role: Role) -> BatchRules:
        return self.inner.rules(role)

    def on_arrival(self, req: Request, now: float, workers: Sequence[WorkerState]) -> list[Assignment]:
        _read(workers)
        return self.inner.on_arrival(req, now, workers)

    def on_iteration_end(self, worker: WorkerState, now: float,
                         workers: Sequence[WorkerState]) -> list[Assignment]:
        _read(workers)
        return self.inner.on_iteration_end(worker, now, workers)

    def decode_worker(self, req: Request, workers: Sequence[WorkerState], now: float) -> WorkerState | None:
        _read(workers)
        return self.inner.decode_worker(req, workers, now)


def _read(workers: Sequence[WorkerState]) -> None:
    for w in workers:
        assert w.load_floor <= w.unfinished_tokens, "a floor above the load would misorder a walk"
        unfinished = w.unfinished_tokens
        assert w.steps >= 0 and w.unfinished_tokens == unfinished, "booking must not change the load"


def _requests(n: int) -> list[Request]:
    return [make_request(i, arrival=0.05 * i, prompt=64 + 37 * (i % 7), output=40 + 61 * (i % 5))
            for i in range(n)]


def _outcome(policy: Policy) -> tuple[list[tuple[int, float | None, float | None, int | None]], int]:
    workers = linear_cluster(6, 40_000).build(policy)
    sim = Simulator(workers, policy, _requests(120))
    done = sim.run()
    return [(r.id, r.first_token, r.finish, r.decode_worker) for r in done], sim.settled


@pytest.mark.parametrize("name", ["colocated", "disagg", "tropical+", "kv-router"])
def test_reading_every_worker_before_every_decision_changes_no_decision(name: str) -> None:
    lazy, lazy_settled = _outcome(make_policy(name))
    eager, eager_settled = _outcome(ReadsEveryWorker(make_policy(name)))
    assert [(i, d) for i, _, _, d in lazy] == [(i, d) for i, _, _, d in eager]
    assert [t for _, t, _, _ in lazy] == pytest.approx([t for _, t, _, _ in eager], rel=1e-12)
    assert [t for _, _, t, _ in lazy] == pytest.approx([t for _, _, t, _ in eager], rel=1e-12)
    assert eager_settled > lazy_settled, "reading every worker books runs the decisions never read"


def test_the_walk_by_load_orders_by_exact_load_while_runs_are_unbooked() -> None:
    policy = make_policy("colocated")
    workers = linear_cluster(5, 40_000).build(policy)
    sim = Simulator(workers, policy, _requests(60))
    checked = 0
    original = policy.on_arrival

    def checking(req: Request, now: float, seen: Sequence[WorkerState]) -> list[Assignment]:
        nonlocal checked
        walked = [w.id for w in least_loaded_first(seen)]
        assert walked == [w.id for w in sorted(seen, key=lambda w: (w.unfinished_tokens, w.id))]
        checked += 1
        return original(req, now, seen)

    policy.on_arrival = checking  # type: ignore[method-assign]
    sim.run()
    assert checked == 60
