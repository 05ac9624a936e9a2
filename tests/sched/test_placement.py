"""Path 1 by a prompt's place in each prefill queue: an urgent prompt goes where it starts soonest,
a relaxed one where the whole queue ends soonest, and a thousand-worker choice prices a shortlist
that keeps both."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_request
from tests.sched.test_scale_indexes import fleet
from tropical.core.request import PrefillPath
from tropical.sched.dispatch import least_work
from tropical.sched.load_index import LoadIndex
from tropical.sched.placement import placed_choice, placed_finish
from tropical.sched.prediction import free_at
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sched.tropical import ToggleParams
from tropical.sched.worker import WorkerState

_PREFILL = (Role.PREFILL,)


def two_queues() -> list[WorkerState]:
    """Worker 0 frees at 0.5 s with three relaxed long prompts queued; worker 1 at 1.0 s, empty."""
    soon, late = fleet(2, Role.PREFILL)
    soon.busy_until, late.busy_until = 0.5, 1.0
    for i in range(3):
        soon.enqueue(make_request(i, prompt=4_000, ttft=100.0))
    return [soon, late]


def test_an_urgent_prompt_goes_where_it_starts_soonest_a_relaxed_one_where_the_queue_ends():
    soon, late = workers = two_queues()
    urgent, relaxed = make_request(10, prompt=100, ttft=1.0), make_request(11, prompt=100, ttft=200.0)
    assert least_work(urgent, workers, _PREFILL) is late        # the baselines' dispatch
    chosen = placed_choice(urgent, workers, workers, soon.latency, 0.0, 64, 4)
    assert chosen == (soon, soon.prefill_estimate(urgent))
    assert placed_finish(urgent, soon, 0.0, 64) == pytest.approx(0.5 + soon.prefill_estimate(urgent))
    chosen = placed_choice(relaxed, workers, workers, soon.latency, 0.0, 64, 4)
    assert chosen == (late, late.prefill_estimate(relaxed))
    behind_all = free_at(soon, 0.0) + soon.prefill_estimate(relaxed)
    assert placed_finish(relaxed, soon, 0.0, 64) == pytest.approx(behind_all)


@pytest.mark.parametrize("placed", [True, False])
def test_the_toggle_checks_the_chosen_worker_s_whole_queue_against_the_ttft_slo(placed: bool):
    soon, late = workers = two_queues()
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(placed_dispatch=placed)))
    urgent = make_request(10, prompt=100, ttft=1.5)             # in time behind worker 1's iteration
    [assignment] = policy.on_arrival(urgent, 0.0, workers)
    chosen = soon if placed else late
    assert assignment.worker_id == chosen.id
    assert assignment.first_token == pytest.approx(free_at(chosen, 0.0) + chosen.prefill_estimate(urgent))
    assert assignment.path is (PrefillPath.FALLBACK if placed else PrefillPath.PREFILL_WORKER)


def loaded(seed: int, n: int, indexed: bool) -> list[WorkerState]:
    """``n`` prefill workers, some dead, each freeing at its own time with its own queue."""
    rng = random.Random(seed)
    workers = fleet(n, Role.PREFILL)
    for w in workers:
        w.busy_until = rng.uniform(0.0, 2.0)
        for i in range(rng.randrange(5)):
            w.enqueue(make_request(w.id * 10 + i, prompt=rng.choice([100, 1_000, 4_000]),
                                   ttft=rng.uniform(0.5, 20.0)))
        w.alive = rng.random() > 0.1
    if indexed:
        LoadIndex.over(workers)
    return workers


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([12, 40]), st.floats(0.2, 30.0), st.booleans())
def test_a_large_fleet_s_choice_keeps_the_soonest_free_and_the_soonest_through_its_queue(
        seed: int, n: int, ttft: float, indexed: bool):
    workers = loaded(seed, n, indexed)
    live = [w for w in workers if w.alive]
    req = make_request(9_999, prompt=500, ttft=ttft)

    def finish(w: WorkerState) -> float:
        return placed_finish(req, w, 0.0, 64)

    placed = placed_choice(req, live, workers, live[0].latency, 0.0, 64, 2)
    assert placed is not None
    chosen, own = placed
    assert own == chosen.prefill_estimate(req)
    soonest_free = min(live, key=lambda w: (max(0.0, w.busy_until), w.id))
    soonest_through = min(live, key=lambda w: (free_at(w, 0.0), w.id))
    assert finish(chosen) <= min(finish(soonest_free), finish(soonest_through))
    every = placed_choice(req, live, workers, live[0].latency, 0.0, 64, n)
    assert every is not None and every[0] is min(live, key=lambda w: (finish(w), w.id))
