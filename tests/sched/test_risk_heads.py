"""The kept heads of the queues at risk (sched.risk_heads) hand out what a fresh merge of every
queue would (``AtRisk``), as queues are priced again and the clock moves, back too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sched.test_risk import doom_times, queue
from tropical.sched.risk import AtRisk, QueueRisk
from tropical.sched.risk_heads import DIRECT, KeptAtRisk, RiskHeads

Queues = dict[int, tuple]


def seen(at_risk: AtRisk[str] | KeptAtRisk[str]) -> tuple[object, ...]:
    def listed(doomed_too: bool) -> list[tuple[int, str, float]]:
        return [(r.id, o, f) for r, o, f in at_risk.shortest_first(doomed_too)]
    return listed(False), listed(True), [(r.id, o, f) for r, o, f in at_risk.doomed()], at_risk.count


def kept(heads: RiskHeads, risks: dict[int, QueueRisk], now: float, direct: int = -1) -> KeptAtRisk[str]:
    """The kept answer, from the heaps unless at most ``direct`` queues are at risk."""
    late = sorted(wid for wid, risk in risks.items() if risk.late)
    return KeptAtRisk(heads, late, {wid: f"w{wid}" for wid in risks}, now, direct)


def fresh(risks: dict[int, QueueRisk], now: float) -> AtRisk[str]:
    return AtRisk([(f"w{wid}", risk) for wid, risk in sorted(risks.items()) if risk.late], now)


def mark_all(heads: RiskHeads, risks: dict[int, QueueRisk]) -> None:
    for wid, risk in risks.items():
        heads.mark(wid, bool(risk.late))


rows = st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 20.0), st.sampled_from([50, 100, 200])),
                max_size=10)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, min_size=1, max_size=5), st.lists(st.floats(0.0, 40.0), min_size=1, max_size=8),
       st.lists(st.integers(0, 4), max_size=8), st.lists(st.booleans(), max_size=50),
       st.lists(st.sampled_from([-1, DIRECT]), min_size=1, max_size=8))
def test_the_kept_heads_answer_as_a_fresh_merge_of_every_queue(items, clocks, repriced, yielded, direct):
    """Read from the heaps, or merged directly (a round that finds few queues at risk), in any
    mix: each answer is the fresh merge's."""
    priced: Queues = {}
    first = 0
    for wid, queue_rows in enumerate(items):
        priced[wid] = queue([c for c, _, _ in queue_rows], [t for _, t, _ in queue_rows],
                            [p for _, _, p in queue_rows], first)
        first += len(queue_rows)
    for req, gave_way in zip([r for q in priced.values() for r, _ in q], yielded, strict=False):
        req.yielded = gave_way
    risks = {wid: QueueRisk.of(q, 0.0) for wid, q in priced.items()}
    heads = RiskHeads(risks)
    mark_all(heads, risks)
    edges = [t + nudge for t in doom_times([("", q, 0.0) for q in priced.values()])[:3]
             for nudge in (-1e-9, 0.0, 1e-9)]
    last = 0.0
    for step, now in enumerate([*clocks, *edges]):
        if now < last:                                         # as the watch does: every queue again
            mark_all(heads, risks)
        if step < len(repriced) and repriced[step] in risks:  # a queue priced afresh from a later start
            wid = repriced[step]
            risks[wid] = QueueRisk.of(priced[wid], now)
            heads.mark(wid, bool(risks[wid].late))
        way = direct[step % len(direct)]
        assert seen(kept(heads, risks, now, way)) == seen(fresh(risks, now)), f"at {now}, direct {way}"
        last = now


def test_older_filings_leave_the_heaps_as_a_queue_is_filed_again_and_again():
    priced = queue([0.6, 0.6], [1.0, 1.0])                     # the second is at risk, not doomed
    risks = {0: QueueRisk.of(priced, 0.0)}
    heads = RiskHeads(risks)
    for _ in range(1_000):
        heads.mark(0, True)
        heads.advance(0.0)
    assert len(heads.heads) <= 2 * len(heads.version) + 64
    assert [r.id for r, _, _ in kept(heads, risks, 0.0).shortest_first(False)] == [1]
    risks[0] = QueueRisk.of((), 0.0)                           # the queue ran: none at risk
    heads.mark(0, False)
    assert list(kept(heads, risks, 0.0).shortest_first(False)) == [] and not heads.version
