"""Every substrate builds its workers' states in one place: roles, rules, KV pools and predictors as
given, corrected online exactly where the policy learns (or where the substrate says it must)."""

from __future__ import annotations

from tests.factories import linear_model
from tropical.core.latency.online import OnlineLatency
from tropical.sched.fleet import worker_states
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import Role
from tropical.sched.tropical import ToggleParams


def test_each_worker_gets_its_role_rules_pool_and_predictor():
    policy = make_policy("tropical")
    roles = [Role.PREFILL, Role.MULTIPLEX]
    fast, slow = linear_model(), linear_model(prefill_per_token=2e-4)
    states = worker_states(policy, roles, [(100, 16), (50, 32)], [fast, slow], prefix_cache=True)
    assert [s.id for s in states] == [0, 1] and [s.role for s in states] == roles
    assert [s.rules for s in states] == [policy.rules(r) for r in roles]
    assert [(s.kv.capacity_blocks, s.kv.block_size) for s in states] == [(100, 16), (50, 32)]
    assert all(s.kv.cache is not None for s in states)
    assert [s.latency for s in states] == [fast, slow], "the toggle without correction predicts as given"


def test_predictions_are_corrected_online_where_the_policy_learns_or_the_substrate_asks():
    learning = make_policy("tropical", PolicyParams(toggle=ToggleParams(correct=True)))
    [state] = worker_states(learning, [Role.MULTIPLEX], [(10, 16)], [linear_model()])
    assert isinstance(state.latency, OnlineLatency) and state.kv.cache is None
    [shadow] = worker_states(make_policy("colocated"), [Role.COLOCATED], [(10, 16)], [linear_model()],
                             online=True)
    assert isinstance(shadow.latency, OnlineLatency), "a vLLM shadow always learns its instance's speed"


def test_only_a_policy_that_routes_by_prefix_keeps_the_fleets_directory():
    """Every worker caches either way; the directory of who holds which block is kept only
    where the policy reads it (the cache-blind baselines would pay to index for nothing)."""
    roles = [Role.PREFILL, Role.MULTIPLEX, Role.MULTIPLEX, Role.MULTIPLEX]
    for name, routes in [("tropical+", True), ("kv-router", True), ("kv-router-disagg", True),
                         ("chunked-512/2pools", True), ("chunked-512", False), ("disagg", False),
                         ("colocated", False)]:
        states = worker_states(make_policy(name), roles, [(100, 16)] * 4, [linear_model()] * 4,
                               prefix_cache=True)
        caches = [s.kv.cache for s in states]
        assert all(c is not None for c in caches), name
        directories = {id(c.directory) for c in caches if c is not None}
        assert (caches[0] is not None and caches[0].directory is not None) is routes, name
        assert len(directories) == 1, f"{name}: one directory for the fleet, or none"


def test_the_toggle_keeps_a_directory_only_where_a_walk_has_more_workers_than_its_floors_spare():
    """The toggle reads the directory only for floors, and prices every worker of a role
    exactly where it has at most ``FLOORS_FROM``: the paper cluster's two and two keep none."""
    toggle = make_policy("tropical+")
    p, m = Role.PREFILL, Role.MULTIPLEX
    for roles, kept in [([p, p, m, m], False), ([p, m], False), ([p, p, p, m], True),
                        ([p, m, m, m], True), ([p, p, p, m, m, m], True)]:
        states = worker_states(toggle, roles, [(100, 16)] * len(roles), [linear_model()] * len(roles),
                               prefix_cache=True)
        caches = [s.kv.cache for s in states]
        assert all(c is not None and (c.directory is not None) is kept for c in caches), roles
