"""The simulator's invariants on small workloads, across every baseline policy."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request
from tropical.core.latency.iterations import decode_time, prefill_time
from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec
from tropical.sched.kv import KVPool
from tropical.sched.registry import PolicyParams, make_policy, policy_names
from tropical.sched.slack import SlackRule
from tropical.sched.tropical import ToggleParams, TropicalPolicy
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.simulator import Simulator

REPLICA = ReplicaSpec(load_model_spec("llama-2-7b"), hardware("a100"), tp=1)


def cluster(num_workers=4, kv_tokens=50_000, model=None):
    spec = WorkerSpec(REPLICA, model or linear_model(), kv_tokens)
    return ClusterSpec("test", (spec,) * num_workers)


def run(policy_name, requests, cl=None):
    policy = make_policy(policy_name)
    workers = (cl or cluster()).build(policy)
    sim = Simulator(workers, policy, requests)
    sim.run()
    return sim


def workload(seed_lengths):
    return [make_request(i, arrival=0.05 * i, prompt=p, output=o)
            for i, (p, o) in enumerate(seed_lengths)]


lengths = st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 60)), min_size=1, max_size=40)


@pytest.mark.parametrize("policy", policy_names())
@settings(max_examples=25, deadline=None)
@given(lengths)
def test_every_request_finishes_once_with_all_its_tokens(policy, spans):
    requests = workload(spans)
    sim = run(policy, requests)
    for req in requests:
        assert req.error is None
        assert req.generated == req.output_len
        assert req.arrival <= req.prefill_start <= req.first_token <= req.finish
    assert all(w.kv.used_blocks == 0 and not w.running and not w.waiting for w in sim.workers)


@pytest.mark.parametrize("policy", policy_names())
def test_kv_usage_never_exceeds_capacity_under_memory_pressure(policy, monkeypatch):
    """30 requests of 1,700 tokens of KV on 4,000-token workers cannot all fit at once: some must
    wait for room (``fits`` says no) and none is ever over-committed (``reserve`` would raise)."""
    refused, peaks = [], []
    original = KVPool.fits

    def watched(self, tokens, watermark=1.0, revived=0):
        fits = original(self, tokens, watermark, revived)
        refused.append(not fits)
        peaks.append(self.used_blocks / self.capacity_blocks)
        return fits

    monkeypatch.setattr(KVPool, "fits", watched)
    requests = [make_request(i, arrival=0.0, prompt=1500, output=200) for i in range(30)]
    run(policy, requests, cluster(kv_tokens=4000))
    assert all(r.generated == r.output_len for r in requests)
    assert any(refused) and max(peaks) > 0.7


@pytest.mark.parametrize("policy", policy_names())
def test_simulation_is_deterministic(policy):
    spans = [(100 + 37 * i % 2000, 1 + 7 * i % 50) for i in range(60)]
    first, second = workload(spans), workload(spans)
    run(policy, first)
    run(policy, second)
    assert [(r.first_token, r.finish) for r in first] == [(r.first_token, r.finish) for r in second]


@pytest.mark.parametrize("policy", policy_names())
def test_closed_form_decode_runs_match_iteration_by_iteration(policy):
    spans = [(200 + 53 * i % 1500, 2 + 11 * i % 70) for i in range(40)]
    fast, slow = workload(spans), workload(spans)
    closed = run(policy, fast)
    chosen = make_policy(policy)
    stepped = Simulator(cluster().build(chosen), chosen, slow, step_by_step=True)
    stepped.run()
    assert [s.iterations for s in closed.stats] == [s.iterations for s in stepped.stats]
    for a, b in zip(fast, slow, strict=True):
        assert a.first_token == pytest.approx(b.first_token, abs=1e-9)
        assert a.finish == pytest.approx(b.finish, abs=1e-9)


def test_colocated_single_request_matches_hand_computation():
    model = linear_model()
    req = make_request(prompt=1000, output=4)
    run("colocated", [req])
    first = prefill_time(model, 1000)
    decodes = sum(decode_time(model, 1, 1000 + g) for g in (1, 2, 3))
    assert req.first_token == pytest.approx(first)
    assert req.finish == pytest.approx(first + decodes)


def test_disagg_pays_the_kv_transfer_before_decoding():
    model = linear_model()
    req = make_request(prompt=1000, output=3)
    sim = run("disagg", [req])
    transfer = model.transfer_time(1000)
    assert req.migration_time == pytest.approx(transfer)
    assert req.first_token == pytest.approx(prefill_time(model, 1000))
    decodes = decode_time(model, 1, 1001) + decode_time(model, 1, 1002)
    assert req.finish == pytest.approx(req.first_token + transfer + decodes)
    assert req.prefill_worker in (0, 1) and req.decode_worker in (2, 3)
    assert sim.stats[req.decode_worker].iterations == 2


def test_a_worker_s_prefill_time_counts_the_iterations_that_compute_prompt_tokens():
    """Under disaggregation a prefill worker's busy time is all prefill and a decode worker's
    none; on a colocated worker it is the prompt's iteration alone, not its decodes."""
    model = linear_model()
    requests = [make_request(i, arrival=5.0 * i, prompt=1000, output=3) for i in range(2)]
    sim = run("disagg", requests)
    for stats in sim.stats[:2]:
        assert stats.prefill_busy == pytest.approx(stats.busy)
    assert sum(s.prefill_busy for s in sim.stats[:2]) == pytest.approx(2 * prefill_time(model, 1000))
    assert all(s.prefill_busy == 0 for s in sim.stats[2:]) and any(s.busy for s in sim.stats[2:])
    sim = run("colocated", [make_request(prompt=1000, output=4)])
    assert sim.stats[0].prefill_busy == pytest.approx(prefill_time(model, 1000))
    assert sim.stats[0].prefill_busy < sim.stats[0].busy


def test_request_larger_than_any_kv_cache_fails_with_a_reason():
    req = make_request(prompt=60_000, output=5)
    ok = make_request(1, prompt=100, output=5)
    run("colocated", [req, ok])
    assert "KV cache" in req.error and ok.error is None


def test_prompt_beyond_the_context_window_fails():
    req = make_request(prompt=5000, output=5)
    policy = make_policy("chunked")
    Simulator(cluster().build(policy), policy, [req], max_context=4096).run()
    assert "context window" in req.error


def test_workers_may_differ_in_speed():
    slow, fast = linear_model(), linear_model(prefill_per_token=1e-5)
    spec_slow, spec_fast = WorkerSpec(REPLICA, slow, 50_000), WorkerSpec(REPLICA, fast, 50_000)
    cl = ClusterSpec("mixed", (spec_fast, spec_slow))
    a, b = make_request(0, prompt=2000, output=2), make_request(1, prompt=2000, output=2)
    run("colocated", [a, b], cl)
    assert a.first_token == pytest.approx(prefill_time(fast, 2000))
    assert b.first_token == pytest.approx(prefill_time(slow, 2000))
    assert replace(spec_fast, kv_tokens=None).kv_capacity_tokens == REPLICA.kv_capacity_tokens


def test_miss_budget_stops_a_hopeless_run_early():
    requests = [make_request(i, arrival=0.0, prompt=3000, output=20, ttft=0.05) for i in range(40)]
    policy = make_policy("colocated")
    sim = Simulator(cluster(num_workers=1).build(policy), policy, requests, miss_budget=4)
    sim.run()
    assert sim.misses > 4
    assert sum(r.error is not None for r in requests) > 20
    assert all("miss budget" in r.error for r in requests if r.error)


@pytest.mark.parametrize("policy", ["colocated", "disagg"])
@settings(max_examples=15, deadline=None)
@given(lengths)
def test_closed_form_runs_book_the_same_gaps_as_single_steps(policy, spans):
    closed = workload(spans)
    run(policy, closed)
    stepped = workload(spans)
    stepping = make_policy(policy)
    stepping.wants_iteration_events = lambda: True      # one decode iteration per event
    Simulator(cluster().build(stepping), stepping, stepped).run()
    for a, b in zip(closed, stepped, strict=True):
        assert a.max_gap == pytest.approx(b.max_gap, rel=1e-6, abs=1e-9)
        assert a.max_gap >= (a.finish - a.first_token) / max(1, a.output_len - 1) - 1e-9


def test_a_banked_toggle_says_when_it_asks_to_look_again(monkeypatch):
    """Under banked slack the toggle asks to be called at a later decode step (``check_step``)
    and says so (``checking``, which the simulator reads before cutting runs in flight); closed-
    form runs decide as iteration-by-iteration ones do."""
    asked = []
    original = TropicalPolicy.check_step

    def watched(self, worker):
        step = original(self, worker)
        asked.append((step is not None, self.checking))
        return step

    monkeypatch.setattr(TropicalPolicy, "check_step", watched)
    params = PolicyParams(toggle=ToggleParams(slack=SlackRule.BANKED))
    runs = []
    for step_by_step in (False, True):
        requests = [make_request(i, arrival=0.02 * i, prompt=200 + 53 * i % 1500, output=2 + 11 * i % 70)
                    for i in range(80)]                         # enough load to put TTFTs at risk
        policy = make_policy("tropical", params)
        Simulator(cluster().build(policy), policy, requests, step_by_step=step_by_step).run()
        runs.append(requests)
    assert any(step for step, _ in asked) and all(checking for step, checking in asked if step)
    for a, b in zip(*runs, strict=True):
        assert (a.path, a.prefill_worker) == (b.path, b.prefill_worker)
        assert a.finish == pytest.approx(b.finish, abs=1e-9)
