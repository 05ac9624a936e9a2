"""One Cluster, two substrates: a trace slice through the simulator and through the router (fake
workers that take the simulator's time, a virtual clock) gives the same batches, decisions and
bookings, for every policy."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.factories import linear_cluster
from tests.serve.fake_cluster import finished, record_plans, run_virtual, start_router, submit_at_arrivals
from tropical.core.request import PrefillPath, Request
from tropical.core.slo import SLO
from tropical.sched.registry import make_policy, policy_names
from tropical.sim.cluster import ClusterSpec
from tropical.sim.simulator import Simulator


def trace_slice(seed: int = 3, count: int = 40) -> list[Request]:
    """Requests of mixed lengths, arriving close enough together to queue, multiplex and stall."""
    rng = random.Random(seed)
    requests, now = [], 0.0
    for rid in range(count):
        now += rng.expovariate(8.0)
        prompt, output = rng.choice([rng.randint(20, 400), rng.randint(1500, 4000)]), rng.randint(1, 40)
        requests.append(Request(rid, now, prompt, output, SLO(rng.choice([150, 400, 900]) / 1e3,
                                                              rng.choice([20, 40]) / 1e3)))
    return requests


def cluster() -> ClusterSpec:
    """Four workers whose KV holds a few long requests at once, so decodes wait for room."""
    return linear_cluster(4, 12_000)


def simulate(policy_name: str, requests: list[Request]) -> list[tuple]:
    policy = make_policy(policy_name)
    sim = Simulator(cluster().build(policy), policy, requests, step_by_step=True)
    plans: list = []
    sim.cluster.plan = record_plans(sim.cluster.plan, plans)
    sim.run()
    return plans


def serve(policy_name: str, requests: list[Request]) -> tuple[list[Request], list[tuple]]:
    async def main(loop: asyncio.AbstractEventLoop) -> tuple[list[Request], list[tuple]]:
        policy = make_policy(policy_name)
        fake = start_router(loop, policy, cluster().build(policy), {r.id: r.prompt_len for r in requests})
        handles = await submit_at_arrivals(loop, fake.router, requests)
        for handle in handles:
            await finished(handle)
        await fake.router.stop()
        return [h.req for h in handles], fake.plans
    return run_virtual(main)


def batches(plans: list[tuple]) -> list[tuple]:
    """Each planned batch: worker, start time, prompt spans (request, new, cached), decodes."""
    return [(w, pytest.approx(now, abs=1e-9), [(r.id, new, cached) for r, new, cached in b.prefills],
             b.decode_count, b.decode_context) for w, now, b in plans]


def booked(requests: list[Request]) -> list[tuple]:
    """What each request's run recorded: its decision, workers, and every milestone."""
    return [(r.id, r.path, r.reason, r.prefill_worker, r.decode_worker, r.generated, r.error,
             *(pytest.approx(t, abs=1e-9) for t in (r.prefill_start, r.first_token, r.finish,
                                                    r.migration_time)))
            for r in sorted(requests, key=lambda r: r.id)]


@pytest.mark.parametrize("policy", policy_names())
def test_simulator_and_router_form_the_same_batches_and_decisions(policy: str) -> None:
    simulated, served = trace_slice(), trace_slice()
    sim_plans = simulate(policy, simulated)
    router_requests, router_plans = serve(policy, served)
    assert all(r.error is None for r in simulated), "the slice must run to the end in the simulator"
    assert booked(router_requests) == booked(simulated)
    for worker in range(4):
        assert batches([p for p in router_plans if p[0] == worker]) == \
            batches([p for p in sim_plans if p[0] == worker])


def test_the_slice_exercises_multiplexing_and_migration() -> None:
    """The equivalence above covers Path 2, Path 1 with KV migration, and both kinds of batch."""
    requests = trace_slice()
    plans = simulate("tropical", requests)
    paths = {r.path for r in requests}
    assert {PrefillPath.MULTIPLEX, PrefillPath.PREFILL_WORKER} <= paths
    assert any(r.migration_time > 0 for r in requests)
    assert any(b.prefills and b.decode_count for _, _, b in plans)
