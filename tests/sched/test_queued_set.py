"""The toggle asks only the prefill queues it queued prompts on (``TropicalPolicy._queued_at_risk``):
whatever happens to the queues (prompts run, move, yield, are aborted; workers die, come back,
change roles),
it finds exactly the prompts at risk that asking every prefill worker of the roster would."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_cluster, make_request
from tropical.core.request import Request
from tropical.sched.cluster import Cluster
from tropical.sched.risk import AtRisk
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


class Checked(TropicalPolicy):
    """The toggle, checking at every look that its queue set misses no prompt at risk."""

    looks = 0

    def _queued_at_risk(self, now: float) -> AtRisk[WorkerState]:
        kept = super()._queued_at_risk(now)
        every = AtRisk([(w, self._risk_of(w, now)) for w in self._kept.prefill_by_id.values()], now)
        assert _seen(kept) == _seen(every)
        Checked.looks += 1
        return kept


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
    before = Checked.looks
    Simulator(states, policy, _requests(random.Random(seed), 80)).run()
    assert Checked.looks > before


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
        policy._queued_at_risk(now)
