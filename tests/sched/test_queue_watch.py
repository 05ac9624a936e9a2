"""The toggle's watch of the prefill queues (sched.queue_watch): a queue is looked at again only
when its worker changed or the clock reached its start, and its answers are those of a fresh
look at every queue."""

from __future__ import annotations

import pytest

from tests.factories import make_request, make_worker
from tests.sched.test_path2_prices import burst_outcomes
from tropical.sched.queue_watch import QueueWatch
from tropical.sched.risk import AtRisk, QueueRisk
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState

Answer = list[tuple[int, list[tuple[int, float]]]]


def answer(at_risk: AtRisk[WorkerState]) -> Answer:
    """Each queue at risk by its worker's id, with its at-risk prompts and their finishes."""
    return [(w.id, [(e[2].id, e[4]) for e in risk.late]) for w, risk in at_risk.queues]


def fresh(watch: QueueWatch, by_id: dict[int, WorkerState], now: float) -> Answer:
    """Every queue the watch follows, priced from scratch (what the toggle asked before)."""
    found = []
    for worker_id in sorted(watch.queued_on):
        worker = by_id.get(worker_id)
        if worker is not None and len(worker.waiting) > worker.batch_prefills:
            risk = QueueRisk.of(worker.queued_costs(watch.lookahead), max(now, worker.busy_until))
            if risk.late:
                found.append((worker_id, [(e[2].id, e[4]) for e in risk.late]))
    return found


def queue(worker: WorkerState, *rids: int) -> None:
    """Queue prompts whose TTFT SLO no queue can meet."""
    for rid in rids:
        worker.enqueue(make_request(rid, prompt=2_000, ttft=0.001))


def ids(found: Answer) -> list[tuple[int, list[int]]]:
    return [(wid, [rid for rid, _ in late]) for wid, late in found]


def test_a_queue_is_looked_at_again_only_once_its_worker_changed_or_the_clock_reached_its_start():
    watch = QueueWatch(lookahead=8)
    workers = [make_worker(Role.PREFILL, wid=i) for i in range(3)]
    watch.follow(workers)
    by_id = {w.id: w for w in workers}
    for w in workers:
        w.busy_until = 1.0
    queue(workers[0], 1, 2)
    queue(workers[2], 3)
    watch.queued([0, 2])
    found = answer(watch.at_risk(by_id, 0.5))
    assert found == fresh(watch, by_id, 0.5) and ids(found) == [(0, [1, 2]), (2, [3])]
    kept = watch.risks[0]
    assert watch.at_risk(by_id, 0.6).queues[0][1] is kept, "nothing moved: the answer stands"
    assert not watch.marked
    queue(workers[0], 4)
    assert workers[0].id in watch.marked, "an edit of the queue marks its worker"
    assert answer(watch.at_risk(by_id, 0.7)) == fresh(watch, by_id, 0.7)
    assert answer(watch.at_risk(by_id, 1.5)) == fresh(watch, by_id, 1.5), "idle from 1.0: from the clock"


def test_a_queue_emptied_or_no_longer_a_prefill_workers_has_none_at_risk():
    watch = QueueWatch(lookahead=8)
    workers = [make_worker(Role.PREFILL, wid=i) for i in range(2)]
    watch.follow(workers)
    queue(workers[0], 1)
    queue(workers[1], 2)
    watch.queued([0, 1])
    by_id = {w.id: w for w in workers}
    assert [wid for wid, _ in answer(watch.at_risk(by_id, 0.0))] == [0, 1]
    workers[0].abort(workers[0].waiting[0])
    assert ids(answer(watch.at_risk(by_id, 0.0))) == [(1, [2])]
    assert 0 not in watch.queued_on
    watch.follow([workers[0]])
    assert answer(watch.at_risk({0: workers[0]}, 0.0)) == [], "worker 1 left the prefill roster"


@pytest.mark.parametrize("policy", ["tropical+", "tropical"])
def test_every_answer_of_the_watch_is_a_fresh_look_at_every_queue(policy: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    watched = QueueWatch.at_risk
    answers = []

    def checked(self: QueueWatch, by_id: dict[int, WorkerState], now: float) -> AtRisk[WorkerState]:
        expected = fresh(self, by_id, now)
        got = watched(self, by_id, now)
        assert answer(got) == expected, f"at {now}"
        answers.append(expected)
        return got

    monkeypatch.setattr(QueueWatch, "at_risk", checked)
    checked_outcomes = burst_outcomes(policy)
    monkeypatch.undo()
    assert sum(len(a) > 0 for a in answers) > 200, "the burst must put prompts at risk often"
    assert burst_outcomes(policy) == checked_outcomes
