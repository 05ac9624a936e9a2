"""Path 2's prices kept between decisions (sched.path2_prices): a kept price is used only while
nothing it was computed from can have moved, and keeping them changes no decision."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.factories import make_request, make_worker
from tropical.config import SimConfig
from tropical.core.request import Request
from tropical.sched.path2_prices import Path2Prices
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState
from tropical.sim import run
from tropical.sim.build import experiment


class Counted:
    """A price computation that counts its calls and returns a new price each time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return float(self.calls)


def test_a_price_is_kept_while_the_worker_is_busy_and_neither_it_nor_the_prompt_moved() -> None:
    prices, compute = Path2Prices(), Counted()
    worker, req = make_worker(Role.MULTIPLEX), make_request(1, prompt=300)
    worker.busy_until = 5.0
    assert prices.price(req, worker, 1.0, compute) == 1.0
    assert prices.price(req, worker, 2.0, compute) == 1.0, "a later clock alone moves no busy worker's price"
    assert compute.calls == 1


@pytest.mark.parametrize("move", ["worker edited", "worker idle", "prompt progressed", "prompt yielded",
                                  "prompt moved", "worker revived"])
def test_a_price_is_computed_again_once_anything_it_read_can_have_moved(move: str) -> None:
    prices, compute = Path2Prices(), Counted()
    worker, req = make_worker(Role.MULTIPLEX, wid=3), make_request(1, prompt=300)
    worker.busy_until = 5.0
    prices.price(req, worker, 1.0, compute)
    now = 1.0
    if move == "worker edited":
        worker.enqueue(make_request(2))
    elif move == "worker idle":
        now = 6.0
    elif move == "prompt progressed":
        req.computed = 100
    elif move == "prompt yielded":
        req.yielded = True
    elif move == "prompt moved":
        req.prefill_worker = 7
    else:
        worker = make_worker(Role.MULTIPLEX, wid=3)
        worker.busy_until = 5.0
    assert prices.price(req, worker, now, compute) == 2.0
    assert compute.calls == 2


def burst_outcomes(policy: str) -> list[tuple[object, ...]]:
    """Every request's path, workers, hit and times in a burst on 40 workers (more multiplexing
    workers than a shortlist holds)."""
    cfg = SimConfig().with_preset().updated(
        {"policy": policy, "trace": "conversation", "workers": 40, "arrivals": "poisson", "rate": 400.0,
         "limit": 500}, "test")
    return [(r.id, r.path, r.prefill_worker, r.decode_worker, r.cached, r.first_token, r.finish)
            for r in run.simulate(experiment(cfg)).requests]


@pytest.mark.parametrize("policy", ["tropical+", "tropical"])
def test_every_kept_price_is_the_price_computed_again(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kept_prices = Path2Prices.price
    used = []

    def checked(self: Path2Prices, req: Request, worker: WorkerState, now: float,
                compute: Callable[[], float | None]) -> float | None:
        fresh = compute()
        price = kept_prices(self, req, worker, now, lambda: fresh)
        assert price == fresh, f"request {req.id} on worker {worker.id} at {now}: kept {price}, now {fresh}"
        used.append(price)
        return fresh

    monkeypatch.setattr(Path2Prices, "price", checked)
    checked_outcomes = burst_outcomes(policy)
    monkeypatch.undo()
    assert len(used) > 500, "the burst must price Path 2 often"
    assert burst_outcomes(policy) == checked_outcomes
