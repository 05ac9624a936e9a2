"""Path 2 prices the multiplexing workers from the lowest floor up: each floor is never above the
price it stands for, the walk yields every worker in order of its price, and a fleet decides
exactly as it does when every worker is priced, when those whose floor is not worth taking are
priced too, or when no worker is priced last for a refusal its lineup remembers."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_worker
from tropical.config import SimConfig
from tropical.sched import tropical
from tropical.sched.chunk import Lineup
from tropical.sched.dispatch import by_cost, least_bound_first
from tropical.sched.path2_floors import chunked_floors
from tropical.sched.tropical import TropicalPolicy
from tropical.sim.build import experiment
from tropical.sim.run import simulate


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), min_size=0, max_size=30))
def test_by_cost_yields_every_worker_in_order_of_cost_and_prices_only_what_it_must(
        terms: list[tuple[int, int]]) -> None:
    workers = [make_worker(wid=i) for i in range(len(terms))]
    cost = {w.id: float(c) for w, (c, _) in zip(workers, terms, strict=True)}
    priced: list[int] = []

    def price(worker: object) -> float:
        priced.append(worker.id)  # type: ignore[attr-defined]
        return cost[worker.id]  # type: ignore[attr-defined]

    floors = [(cost[w.id] - slack, w.id, w) for w, (_, slack) in zip(workers, terms, strict=True)]
    bounds = least_bound_first(floors)
    walk = by_cost(bounds, price)
    first = next(walk, None)
    if first is not None:
        assert all(floor <= first[0] for floor, wid, _ in floors if wid in priced)
    order = ([first] if first is not None else []) + list(walk)
    assert [(c, wid) for c, wid, _ in order] == sorted((cost[w.id], w.id) for w in workers)
    assert sorted(priced) == [w.id for w in workers]


Outcome = tuple[int, float, float, int | None, int | None]


def fleet_run(workers: int | None = 64, scale: float = 16.0, limit: int = 500) -> list[Outcome]:
    """``tropical+``'s outcomes on ``workers`` (None: the preset's cluster) at rate ``scale``."""
    cfg = SimConfig(limit=limit).with_preset()
    if workers is not None:
        cfg = replace(cfg, workers=workers)
    result = simulate(experiment(cfg).with_policy("tropical+").at_rate(scale))
    return [(r.id, r.first_token, r.finish, r.prefill_worker, r.decode_worker) for r in result.requests]


def test_floors_never_exceed_the_price_and_change_no_decision(monkeypatch) -> None:
    looks = []
    walk = TropicalPolicy._by_first_look

    def checked(self, req, workers, plans, now, worth_by):  # type: ignore[no-untyped-def]
        floor = chunked_floors(req, workers, now)
        assert floor is not None
        looks.extend((floor(w), self._first_look(req, w, plans, now, False)) for w in workers)
        return walk(self, req, workers, plans, now, worth_by)

    monkeypatch.setattr(TropicalPolicy, "_by_first_look", checked)
    floored = fleet_run()
    assert len(looks) > 1_000
    assert all(floor <= price for floor, price in looks)
    assert sum(price < float("inf") for _, price in looks) > 1_000
    monkeypatch.setattr(TropicalPolicy, "_by_first_look", walk)
    monkeypatch.setattr(tropical, "FLOORS_FROM", 10**9)
    assert fleet_run() == floored


def test_workers_whose_floor_is_not_worth_taking_are_never_looked_at(monkeypatch) -> None:
    """A worker whose floor already misses the prompt's TTFT SLO (or Path 1's finish) is left
    out of the walk: fewer looks than with every worker walked, and the same decisions (16
    workers at four times the preset's rate: past their capacity, where rounds read prompts
    that no multiplexing worker can still save)."""
    looks = 0
    first_look, walk = TropicalPolicy._first_look, TropicalPolicy._by_first_look

    def counted(self, req, worker, plans, now, within_slo):  # type: ignore[no-untyped-def]
        nonlocal looks
        looks += 1
        return first_look(self, req, worker, plans, now, within_slo)

    def unfiltered(self, req, workers, plans, now, worth_by):  # type: ignore[no-untyped-def]
        return walk(self, req, workers, plans, now, None)

    monkeypatch.setattr(TropicalPolicy, "_first_look", counted)
    filtered, filtered_looks = fleet_run(16, 16.0), looks
    looks = 0
    monkeypatch.setattr(TropicalPolicy, "_by_first_look", unfiltered)
    assert fleet_run(16, 16.0) == filtered
    assert filtered_looks < 0.9 * looks


def test_workers_that_refused_a_prompt_the_candidate_covers_are_walked_last_and_decide_alike(
        monkeypatch) -> None:
    """A worker whose lineup refused a prompt that the candidate covers (``Lineup.refused``) is
    priced last and passed over: the same decisions as when every lineup forgets its refusals
    (and walks its prompts again), and some first looks were such (16 workers past their
    capacity, as above)."""
    covered = 0
    refused = Lineup.refused

    def counted(self, chunk, start, own, ahead):  # type: ignore[no-untyped-def]
        nonlocal covered
        answer = refused(self, chunk, start, own, ahead)
        covered += answer
        return answer

    monkeypatch.setattr(Lineup, "refused", counted)
    remembered = fleet_run(16, 16.0)
    assert covered > 100
    monkeypatch.setattr(Lineup, "refused", lambda self, chunk, start, own, ahead: False)
    assert fleet_run(16, 16.0) == remembered


def test_workers_without_room_for_the_prompt_alone_are_priced_last_and_decide_alike(monkeypatch) -> None:
    """A worker with no seat or KV for the prompt alone (it refuses it behind its queue too) is
    priced last, unlooked at: the same decisions as when it is looked at and refused, and at the
    paper cluster's full trace rate many such workers."""
    refusals = 0
    alone = TropicalPolicy._refuses_alone

    def counted(self, worker, own):  # type: ignore[no-untyped-def]
        nonlocal refusals
        answer = alone(self, worker, own)
        refusals += answer
        return answer

    monkeypatch.setattr(TropicalPolicy, "_refuses_alone", counted)
    skipped = fleet_run(None, 1.0, 600)
    assert refusals > 100
    monkeypatch.setattr(TropicalPolicy, "_refuses_alone", lambda self, worker, own: False)
    assert fleet_run(None, 1.0, 600) == skipped



def test_prompts_that_alone_finish_past_their_slo_are_not_lined_up_and_decide_alike(monkeypatch) -> None:
    """A look whose prompt alone would finish past its TTFT SLO on a worker gets that floor,
    without lining the worker's queue up: the same decisions as when every look lines it up,
    fewer lineups built, and at the paper cluster's full trace rate many such looks."""
    built, floors, read = 0, 0, 0
    line_up, look, lineup_of = Lineup.of, TropicalPolicy._unchecked_finish, TropicalPolicy._lineup_of

    def counted_build(worker, queue, carried, laxity):  # type: ignore[no-untyped-def]
        nonlocal built
        built += 1
        return line_up(worker, queue, carried, laxity)

    def counted_read(self, worker, now):  # type: ignore[no-untyped-def]
        nonlocal read
        read += 1
        return lineup_of(self, worker, now)

    def counted_look(self, req, worker, now, within_slo):  # type: ignore[no-untyped-def]
        nonlocal floors
        before = read
        finish = look(self, req, worker, now, within_slo)
        floors += read == before and math.isfinite(finish)
        return finish

    monkeypatch.setattr(Lineup, "of", staticmethod(counted_build))
    monkeypatch.setattr(TropicalPolicy, "_lineup_of", counted_read)
    monkeypatch.setattr(TropicalPolicy, "_unchecked_finish", counted_look)
    shortcut, shortcut_built = fleet_run(None, 1.0, 600), built
    assert floors > 100
    built = 0
    monkeypatch.setattr(TropicalPolicy, "_unchecked_finish",
                        lambda self, req, worker, now, within_slo: look(self, req, worker, now, False))
    assert fleet_run(None, 1.0, 600) == shortcut
    assert shortcut_built < built
