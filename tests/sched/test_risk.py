"""A prefill queue passes for having nothing to save only when an exact scan would agree."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_request
from tropical.sched.risk import QueueRisk, doomed


def queue(costs: list[float], ttfts: list[float]) -> tuple:
    pairs = enumerate(zip(costs, ttfts, strict=True))
    return tuple((make_request(i, ttft=ttft), cost) for i, (cost, ttft) in pairs)


def exact_scan(priced: tuple, start: float, now: float) -> tuple[int, int]:
    """The toggle's own scan: (prompts at risk but not doomed, doomed prompts)."""
    clock, saveable, lost = start, 0, 0
    for req, cost in priced:
        clock += cost
        if clock - req.arrival > req.slo.ttft:
            lost += doomed(req, cost, now)
            saveable += not doomed(req, cost, now)
    return saveable, lost


def test_a_queue_that_meets_every_ttft_has_nothing_to_save():
    risk = QueueRisk.of(queue([0.2, 0.3], [1.0, 1.0]))
    assert risk.none_to_save(start=0.1, now=0.0) and risk.doomed_count == 0


def test_a_prompt_late_behind_others_but_not_alone_is_one_to_save():
    risk = QueueRisk.of(queue([0.6, 0.6], [1.0, 1.0]))          # the second ends at 1.2 > 1.0
    assert not risk.none_to_save(start=0.0, now=0.0)


def test_doomed_prompts_are_counted_and_stay_doomed():
    risk = QueueRisk.of(queue([0.6, 0.1], [0.5, 5.0]))          # the first misses even alone
    assert risk.none_to_save(start=0.0, now=0.0) and risk.doomed_count == 1
    assert risk.none_to_save(start=1.0, now=1.0) and risk.doomed_count == 1
    assert risk.none_to_save(start=0.0, now=0.0) and risk.doomed_count == 1   # a fresh look


def test_a_prompt_exactly_on_its_deadline_sends_the_caller_to_the_exact_scan():
    risk = QueueRisk.of(queue([0.5, 0.5], [9.0, 1.0]))          # the second ends at exactly 1.0
    assert not risk.none_to_save(start=0.0, now=0.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 20.0)), min_size=1, max_size=40),
       st.floats(0.0, 50.0), st.floats(0.0, 5.0), st.floats(0.0, 30.0))
def test_nothing_to_save_only_where_the_exact_scan_finds_none(items, now, wait, later):
    priced = queue([c for c, _ in items], [t for _, t in items])
    risk = QueueRisk.of(priced)
    for t in (now, now + later):
        if risk.none_to_save(t + wait, t):
            assert exact_scan(priced, t + wait, t) == (0, risk.doomed_count)
