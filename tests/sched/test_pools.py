"""A fleet sharded into pools: each pool's policy decides within its pool, a request never
leaves the pool the front router chose, and the front router weighs reuse against load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.factories import linear_model
from tests.sched.test_prefix_cache import BLOCK, keys, prefixed
from tropical.config import SimConfig
from tropical.sched.fleet import worker_states
from tropical.sched.pools import PooledPolicy
from tropical.sched.registry import make_policy
from tropical.sched.rules import Role
from tropical.sim.build import experiment
from tropical.sim.run import simulate


def test_a_pooled_fleet_gives_each_pool_its_policys_roles():
    policy = make_policy("tropical+/3pools")
    assert isinstance(policy, PooledPolicy) and len(policy.pools) == 3
    roles = policy.roles(10)
    single = make_policy("tropical+")
    assert roles == single.roles(4) + single.roles(3) + single.roles(3)


def test_fewer_workers_than_pools_and_unknown_inner_policies_are_errors():
    with pytest.raises(ValueError, match="cannot form 4 pools"):
        make_policy("disagg/4pools").roles(3)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope/2pools")


@pytest.mark.parametrize(("name", "pools"), [("tropical+/4pools", 4), ("disagg/4pools", 4),
                                              ("kv-router/2pools", 2)])
def test_every_request_is_prefilled_and_decoded_in_one_pool(name, pools):
    cfg = replace(SimConfig(limit=400).with_preset(), workers=16, policy=name, arrivals="poisson", rate=5.6)
    run = simulate(experiment(cfg))
    size = 16 // pools
    served = [r for r in run.requests if r.decode_worker is not None and r.prefill_worker is not None]
    assert len(served) > 300
    assert all(r.prefill_worker // size == r.decode_worker // size for r in served)
    assert {r.prefill_worker // size for r in served} == set(range(pools))


def test_the_front_router_sends_a_follow_up_to_the_pool_holding_its_history_unless_it_is_loaded():
    policy = make_policy("colocated/2pools")
    workers = worker_states(policy, policy.roles(4), [(4_096, 16)] * 4, [linear_model()] * 4,
                            prefix_cache=True)
    assert [w.role for w in workers] == [Role.COLOCATED] * 4
    history = prefixed(1, keys("abc", 3 * BLOCK), 3 * BLOCK)
    workers[3].enqueue(history)
    assert workers[3].reserve(history)
    workers[3].complete_prefill(history, history.remaining_prompt, now=0.0)
    follow_up = prefixed(2, keys("abcd", 4 * BLOCK), 4 * BLOCK)
    [assignment] = policy.on_arrival(follow_up, 0.0, workers)
    assert assignment.worker_id in (2, 3)
    for i in range(6):
        workers[2].enqueue(prefixed(10 + i, (), 2_000))
    workers[3].enqueue(prefixed(20, (), 2_000))
    again = prefixed(3, keys("abcd", 4 * BLOCK), 4 * BLOCK)
    [assignment] = policy.on_arrival(again, 0.0, workers)
    assert assignment.worker_id in (0, 1)
