"""The kept risk views hand out exactly what a fresh scan of the queues, sorted, would."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_request
from tropical.sched.risk import AtRisk, QueueRisk, doomed


def queue(costs: list[float], ttfts: list[float], prompts: list[int] | None = None,
          first_id: int = 0) -> tuple:
    prompts = prompts or [100] * len(costs)
    items = enumerate(zip(costs, ttfts, prompts, strict=True), start=first_id)
    return tuple((make_request(i, ttft=ttft, prompt=p), cost) for i, (cost, ttft, p) in items)


def exact_scan(queues: list[tuple[str, tuple, float]], now: float) -> tuple[list, list]:
    """The toggle's scan as written before views were kept (prompts that yielded not at risk, but
    in the clock): (to save, doomed), scan order."""
    hopeful, hopeless = [], []
    for owner, priced, start in queues:
        clock = start
        for req, cost in priced:
            clock += cost
            if not req.yielded and clock - req.arrival > req.slo.ttft:
                (hopeless if doomed(req, cost, now) else hopeful).append((req, owner, clock))
    return hopeful, hopeless


def view(queues: list[tuple[str, tuple, float]], now: float) -> AtRisk[str]:
    return AtRisk([(owner, QueueRisk.of(priced, start)) for owner, priced, start in queues], now)


def by_length(entries: list) -> list:
    return sorted(entries, key=lambda e: e[0].prompt_len)


def test_a_queue_that_meets_every_ttft_has_none_at_risk():
    risk = view([("a", queue([0.2, 0.3], [1.0, 1.0]), 0.1)], now=0.0)
    assert risk.count == 0 and list(risk.shortest_first(doomed_too=True)) == []


def test_a_prompt_late_behind_others_but_not_alone_is_one_to_save():
    priced = queue([0.6, 0.6], [1.0, 1.0])                     # the second ends at 1.2 > 1.0
    risk = view([("a", priced, 0.0)], now=0.0)
    assert [(r.id, o, f) for r, o, f in risk.shortest_first(doomed_too=False)] == [(1, "a", 1.2)]
    assert risk.doomed() == []


def test_doomed_prompts_are_left_out_or_put_after_others_of_their_length():
    priced = queue([0.6, 0.6, 0.1], [0.5, 1.0, 0.05], prompts=[100, 100, 50])
    risk = view([("a", priced, 0.0)], now=0.0)                 # 0 and 2 miss even alone
    assert [r.id for r, _, _ in risk.shortest_first(doomed_too=False)] == [1]
    assert [r.id for r, _, _ in risk.shortest_first(doomed_too=True)] == [2, 1, 0]
    assert [r.id for r, _, _ in risk.doomed()] == [0, 2]


def test_a_kept_view_answers_only_for_its_queue_and_start():
    priced = queue([0.6, 0.6], [1.0, 1.0])
    risk = QueueRisk.of(priced, 0.0)
    assert risk.kept_for(priced, 0.0)
    assert not risk.kept_for(priced, 0.5) and not risk.kept_for(queue([0.6, 0.6], [1.0, 1.0]), 0.0)


def test_an_empty_queue_is_kept_from_any_start_but_not_for_another_queue():
    empty = ()
    risk = QueueRisk.of(empty, 0.0)
    assert risk.kept_for(empty, 7.5) and risk.late == []
    assert not risk.kept_for(queue([0.6], [1.0]), 0.0)
    assert not QueueRisk.of(queue([0.6], [1.0]), 0.0).kept_for(empty, 0.0)


def test_the_open_prompts_shrink_as_time_passes_and_come_back_if_it_goes_back():
    risk = QueueRisk.of(queue([0.6, 0.6], [1.0, 1.0]), 0.0)
    assert [e[2].id for e in risk.open_at(0.0)] == [1]
    assert risk.open_at(0.5) == []                             # 0.5 + 0.6 > 1.0: doomed
    assert [e[2].id for e in risk.open_at(0.0)] == [1]


queues_strategy = st.lists(
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 20.0), st.sampled_from([50, 100, 200])),
             max_size=12),
    min_size=1, max_size=3)


def doom_times(queues: list[tuple[str, tuple, float]]) -> list[float]:
    """Each queued prompt's last clock at which it is not doomed, as ``doomed`` computes it."""
    return [req.arrival + req.slo.ttft - cost for _, priced, _ in queues for req, cost in priced]


def test_a_prompt_that_yielded_is_not_at_risk_but_delays_those_behind_it():
    priced = queue([0.6, 0.6, 0.6], [0.5, 0.5, 1.5])           # the first two doomed from 0.0 on
    priced[1][0].yielded = True
    risk = view([("a", priced, 0.0)], now=0.0)                 # the third ends at 1.8 > 1.5
    assert [r.id for r, _, _ in risk.doomed()] == [0]
    assert [r.id for r, _, _ in risk.shortest_first(doomed_too=True)] == [2, 0]
    assert risk.count == 2


@settings(max_examples=300, deadline=None)
@given(queues_strategy, st.floats(0.0, 50.0), st.floats(0.0, 5.0), st.floats(0.0, 30.0),
       st.lists(st.booleans(), max_size=36))
def test_the_view_agrees_with_a_fresh_scan_sorted_by_length(items, now, wait, later, yielded):
    queues, first = [], 0
    for k, rows in enumerate(items):
        priced = queue([c for c, _, _ in rows], [t for _, t, _ in rows], [p for _, _, p in rows], first)
        queues.append((f"w{k}", priced, now + wait))
        first += len(rows)
    requests = [req for _, priced, _ in queues for req, _ in priced]
    for req, gave_way in zip(requests, yielded, strict=False):
        req.yielded = gave_way
    kept = [(owner, QueueRisk.of(priced, start)) for owner, priced, start in queues]
    edges = [t + nudge for t in doom_times(queues)[:2] for nudge in (-1e-9, 0.0, 1e-9)]
    for t in (now, now + later, now, *edges):                  # views kept across calls, time back too
        risk = AtRisk(kept, t)
        hopeful, hopeless = exact_scan(queues, t)
        assert list(risk.shortest_first(doomed_too=False)) == by_length(hopeful)
        assert list(risk.shortest_first(doomed_too=True)) == by_length(hopeful + hopeless)
        assert risk.doomed() == hopeless
        assert risk.count == len(hopeful) + len(hopeless)
