"""The toggle's views of multiplexing workers kept between scheduling rounds
(sched.worker_views): a kept view is used only while nothing it was computed from can have
moved, it equals the view computed again, and keeping views changes no decision."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.factories import make_request, make_worker
from tests.sched.test_path2_prices import burst_outcomes
from tropical.sched.chunk import Lineup
from tropical.sched.host_store import HostStore
from tropical.sched.next_iteration import NextIteration
from tropical.sched.pending import Pending
from tropical.sched.prefix_cache import PrefixCache
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState
from tropical.sched.worker_views import WorkerView, WorkerViews


def busy_worker(wid: int = 3) -> WorkerState:
    worker = make_worker(Role.MULTIPLEX, wid=wid)
    worker.enqueue(make_request(1, prompt=300))
    worker.busy_until = 5.0
    return worker


def test_a_view_is_kept_across_rounds_while_its_worker_is_busy_and_unedited() -> None:
    views, worker = WorkerViews(), busy_worker()
    first = views.of(worker, 1.0)
    first.lineup_now(laxity=False)
    views.new_round()
    assert views.of(worker, 2.0) is first, "a later clock alone moves no busy worker's view"


def _edited(worker: WorkerState, view: WorkerView) -> tuple[WorkerState, float]:
    worker.enqueue(make_request(2))
    return worker, 1.0


def _end_moved(worker: WorkerState, view: WorkerView) -> tuple[WorkerState, float]:
    worker.busy_until = 4.0
    return worker, 1.0


def _promised(worker: WorkerState, view: WorkerView) -> tuple[WorkerState, float]:
    view.promise(make_request(2))
    return worker, 1.0


MOVES: dict[str, Callable[[WorkerState, WorkerView], tuple[WorkerState, float]]] = {
    "worker edited": _edited,
    "worker idle": lambda worker, view: (worker, 6.0),
    "iteration end moved": _end_moved,
    "worker revived": lambda worker, view: (busy_worker(), 1.0),
    "prompt promised": _promised,
    "host tier": lambda worker, view: (worker, 1.0),
}
"""Each way a view's worker can move between two rounds: the worker and clock of the second."""


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_view_is_built_again_once_anything_it_read_can_have_moved(move: str) -> None:
    views, worker = WorkerViews(), busy_worker()
    if move == "host tier":
        worker.kv.cache = PrefixCache(worker.kv.block_size, host=HostStore(64))
    first = views.of(worker, 1.0)
    worker, now = MOVES[move](worker, first)
    views.new_round()
    again = views.of(worker, now)
    assert again is not first and again.next == NextIteration.of(worker, now)


def test_within_a_round_a_promise_joins_the_queue_and_the_lineup() -> None:
    views, worker = WorkerViews(), busy_worker()
    view = views.of(worker, 1.0)
    before = view.lineup_now(laxity=False)
    promised = make_request(2, prompt=50)
    view.promise(promised)
    assert views.of(worker, 1.0) is view, "the same round goes on with its promises"
    assert view.lineup_now(laxity=False).order == [*before.order, promised]
    assert view.queued_now() == Pending.of(worker, view.next.queued, view.next.carried), "no promise"


def sums(lineup: Lineup) -> list[Pending]:
    """Every prefix sum of ``lineup``, summed as far as it goes."""
    return [lineup.prefix(n) for n in range(len(lineup.order) + 1)]


@pytest.mark.parametrize("policy", ["tropical+", "tropical"])
def test_every_kept_view_is_the_view_computed_again(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kept_views = WorkerViews.of
    carried = []

    def checked(self: WorkerViews, worker: WorkerState, now: float) -> WorkerView:
        before = self._views.get(worker.id)
        rounds = None if before is None else before.round
        view = kept_views(self, worker, now)
        if view is before and rounds != view.round:  # kept from an earlier round
            assert view.next == NextIteration.of(worker, now), f"worker {worker.id} at {now}"
            if view.lineup is not None:
                fresh = Lineup.of(worker, list(view.next.queued), view.next.carried, view.lineup.laxity)
                assert (view.lineup.order, view.lineup.keys, sums(view.lineup)) == (
                    fresh.order, fresh.keys, sums(fresh)), f"worker {worker.id} at {now}"
            if view.queued is not None:
                assert view.queued == Pending.of(worker, view.next.queued, view.next.carried)
            carried.append(worker.id)
        return view

    monkeypatch.setattr(WorkerViews, "of", checked)
    checked_outcomes = burst_outcomes(policy)
    monkeypatch.setattr(WorkerViews, "_carries", lambda self, view, worker, until, now: False)
    unkept_outcomes = burst_outcomes(policy)
    monkeypatch.undo()
    assert len(carried) > 1_000, "the burst must keep views often"
    assert burst_outcomes(policy) == checked_outcomes == unkept_outcomes
