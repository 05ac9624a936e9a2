"""The toggle asks only the prefill queues it queued prompts on, and of those only the ones that
moved (``QueueWatch``): whatever happens to the queues (prompts run, move, yield, are aborted;
workers die, come back, change roles), it finds exactly the prompts at risk that asking every
prefill worker of the roster would."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_cluster, make_request
from tropical.core.request import Request
from tropical.sched.cluster import Cluster
from tropical.sched.queue_watch import QueueWatch
from tropical.sched.risk import AtRisk, QueueRisk
from tropical.sched.tropical import ToggleParams, TropicalPolicy
from tropical.sched.worker import WorkerState
from tropical.sim.simulator import Simulator

TOGGLES = [ToggleParams(), ToggleParams(demote_doomed=True),
           ToggleParams(chunked=True, laxity=True, least_loaded=True),
           ToggleParams(chunked=True, laxity=True, least_loaded=True, demote_doomed=True),
           ToggleParams(flex=True), ToggleParams(chunked=True, laxity=True, least_loaded=True, flex=True)]
"""The paper's toggle and ``tropical+``, with demotion and with roles lent both ways."""


def _seen(at_risk: AtRisk[WorkerState]) -> tuple[object, ...]:
    def listed(doomed_too: bool) -> list[tuple[int, int, float]]:
        return [(r.id, w.id, f) for r, w, f in at_risk.shortest_first(doomed_too)]
    return listed(True), listed(False), [(r.id, w.id, f) for r, w, f in at_risk.doomed()], at_risk.count


class CheckedWatch(QueueWatch):
    """The watch, checking at every look that it misses no prompt at risk."""

    looks = 0

    def at_risk(self, by_id: dict[int, WorkerState], now: float) -> AtRisk[WorkerState]:
        kept = super().at_risk(by_id, now)
        every = AtRisk([(w, QueueRisk.of(w.queued_costs(self.lookahead), max(now, w.busy_until)))
                        for w in by_id.values()], now)
        assert _seen(kept) == _seen(every)
        CheckedWatch.looks += 1
        return kept


class Checked(TropicalPolicy):
    """The toggle with a checked watch."""

    def __init__(self, max_batched_tokens: int, toggle: ToggleParams) -> None:
        super().__init__(max_batched_tokens, toggle)
        self._watch = CheckedWatch(self.toggle.lookahead)

    def look(self, now: float) -> None:
        self._watch.at_risk(self._kept.prefill_by_id, now)


def _requests(rng: random.Random, n: int) -> list[Request]:
    """Bursts of prompts of many lengths with tight TTFT SLOs: queues build and prompts fall at risk."""
    return [make_request(i, arrival=0.02 * i + (1.0 if i > n // 2 else 0.0),
                         prompt=rng.choice([30, 300, 1200, 2500]), output=rng.randint(1, 60),
                         ttft=rng.choice([0.15, 0.4, 2.0]), tpot=0.2)
            for i in range(n)]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.sampled_from(TOGGLES))
def test_in_a_simulation_the_queue_set_finds_what_every_queue_would(seed, workers, toggle):
    policy = Checked(4096, toggle)
    states = linear_cluster(workers, 30_000).build(policy)
    before = CheckedWatch.looks
    Simulator(states, policy, _requests(random.Random(seed), 80)).run()
    assert CheckedWatch.looks > before


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(TOGGLES))
def test_after_aborts_deaths_and_revivals_the_queue_set_finds_what_every_queue_would(seed, toggle):
    rng = random.Random(seed)
    policy = Checked(4096, toggle)
    cluster = Cluster(linear_cluster(4, 30_000).build(policy), policy)
    requests = _requests(rng, 30)
    now = 0.0
    for req in requests:
        now = req.arrival
        cluster.arrive(req, now)
        op = rng.random()
        if op < 0.3:
            cluster.abort(rng.choice(requests[:req.id + 1]).id, now)
        elif op < 0.4:
            cluster.worker_died(rng.randrange(4), now)
        elif op < 0.5:
            cluster.worker_revived(rng.randrange(4), now)
        elif op < 0.7 and any(w.alive for w in cluster.workers):
            worker = rng.choice([w.id for w in cluster.workers if w.alive])
            batch = cluster.plan(worker, now)
            if batch is not None:
                cluster.book(worker, batch, now + 0.05)
        policy._split(cluster.workers)
        policy.look(now)
