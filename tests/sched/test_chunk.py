"""Chunked multiplexing's predictions: a lineup's placement under laxity order and kept promises."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import linear_model, make_request, make_worker
from tests.sched.test_tropical import REPLICA
from tropical.core.latency.shape import BatchShape
from tropical.core.request import PrefillPath
from tropical.sched.chunk import Chunk, Lineup
from tropical.sched.pending import Pending
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rules import BatchRules, Role
from tropical.sched.tropical import ToggleParams
from tropical.sched.worker import WorkerState
from tropical.sim.cluster import ClusterSpec, WorkerSpec
from tropical.sim.simulator import Simulator

RULES = BatchRules(prefill_first=False, chunked=True, token_budget=4096)


def test_in_arrival_order_a_prompt_waits_for_the_whole_queue():
    worker = make_worker(Role.MULTIPLEX, RULES)
    queue = [make_request(0, prompt=8000, ttft=20.0), make_request(1, prompt=4000, ttft=20.0)]
    lineup = Lineup.of(worker, queue, (), laxity=False)
    assert lineup.order == queue and lineup.place(make_request(2, prompt=100, ttft=0.1)) == 2


def test_by_laxity_an_urgent_prompt_goes_ahead_of_those_with_more_slack():
    worker = make_worker(Role.MULTIPLEX, RULES)
    urgent = make_request(0, prompt=500, ttft=0.5)
    relaxed, later = make_request(1, prompt=8000, ttft=30.0), make_request(2, prompt=8000, ttft=20.0)
    lineup = Lineup.of(worker, [urgent, relaxed, later], (), laxity=True)
    ahead = lineup.place(make_request(3, prompt=300, ttft=1.0))
    assert lineup.order[:ahead] == [urgent]
    assert lineup.order[ahead:] == [later, relaxed]       # least slack first


def test_by_laxity_prompts_with_equal_keys_keep_their_queue_order():
    worker = make_worker(Role.MULTIPLEX, RULES)
    twins = [make_request(i, prompt=2000, ttft=5.0) for i in (7, 3, 9)]
    urgent = make_request(4, prompt=2000, ttft=1.0)
    lineup = Lineup.of(worker, [*twins, urgent], (), laxity=True)
    assert lineup.order == [urgent, *twins]
    assert lineup.keys == sorted(lineup.keys) and lineup.keys[1] == lineup.keys[2] == lineup.keys[3]


def test_a_lineup_sums_each_prefix_after_the_prompts_carried_over():
    worker = make_worker(Role.MULTIPLEX, RULES)
    carried, queued = make_request(0, prompt=3000), [make_request(1, prompt=700), make_request(2, prompt=900)]
    lineup = Lineup.of(worker, queued, [(carried, 1000)], laxity=False)
    assert [lineup.prefix(n).tokens for n in range(3)] == [1000, 1700, 2600]
    assert lineup.prefix(2) == Pending.of(worker, queued, [(carried, 1000)])


def test_going_ahead_is_refused_only_where_it_costs_a_prompt_its_ttft():
    worker = make_worker(Role.MULTIPLEX, RULES)
    chunk = Chunk.of(worker, BatchShape.decode(4, 4000), limit=0.1)
    behind = make_request(0, prompt=3000)
    alone = chunk.finish(worker, Pending.of(worker, [behind]), start=0.0)
    cutter = make_request(1, prompt=2000)
    for slo, kept in ((alone + 0.01, False), (alone * 3, True), (alone - 0.01, True)):
        behind.slo = replace(behind.slo, ttft=slo)
        lineup = Lineup.of(worker, [behind], (), laxity=True)
        assert lineup.keeps_promises(chunk, 0.0, Pending().plus(cutter, worker), ahead=0) is kept


def test_an_urgent_prompt_overtakes_a_long_multiplexed_one_and_both_meet_their_ttft():
    cluster = ClusterSpec("t", (WorkerSpec(REPLICA, linear_model(prefill_per_pair=2e-8), 200_000),) * 2)
    blocker = make_request(0, arrival=0.0, prompt=20_000, output=2, ttft=60.0, tpot=0.1)
    long = make_request(1, arrival=0.01, prompt=16_000, output=2, ttft=9.0, tpot=0.1)
    urgent = make_request(2, arrival=1.0, prompt=500, output=2, ttft=0.6, tpot=0.1)
    policy = make_policy("tropical+", PolicyParams(toggle=ToggleParams(num_prefill=1)))
    Simulator(cluster.build(policy), policy, [blocker, long, urgent]).run()
    assert long.path is urgent.path is PrefillPath.MULTIPLEX
    assert urgent.first_token < long.first_token
    assert urgent.first_token - urgent.arrival <= urgent.slo.ttft
    assert long.first_token - long.arrival <= long.slo.ttft


def test_pending_prompts_price_as_the_batch_of_their_spans():
    worker = make_worker(Role.MULTIPLEX, RULES)
    carried, queued = make_request(0, prompt=3000), [make_request(1, prompt=700), make_request(2, prompt=900)]
    pending = Pending.of(worker, queued, [(carried, 1000)])
    spans = [(1000, 2000), (700, 0), (900, 0)]
    assert pending.shape == BatchShape.of_batch(spans, 0, 0)
    assert pending.with_decodes(5, 800) == BatchShape.of_batch(spans, 5, 800)


def test_a_candidate_s_own_sums_merged_into_a_prefix_are_that_prefix_plus_the_candidate():
    worker = make_worker(Role.MULTIPLEX, RULES)
    queued = [make_request(0, prompt=700), make_request(1, prompt=900)]
    candidate = make_request(2, prompt=300)
    prefix = Pending.of(worker, queued, [(make_request(3, prompt=3000), 1000)])
    assert prefix.merged(Pending().plus(candidate, worker)) == prefix.plus(candidate, worker)


def refusing_lineup() -> tuple[WorkerState, Lineup, Chunk]:
    """A multiplexing worker whose one queued prompt meets its TTFT SLO with 10 ms to spare."""
    worker = make_worker(Role.MULTIPLEX, RULES)
    chunk = Chunk.of(worker, BatchShape.decode(4, 4000), limit=0.1)
    behind = make_request(0, prompt=3000)
    alone = chunk.finish(worker, Pending.of(worker, [behind]), start=0.0)
    behind.slo = replace(behind.slo, ttft=alone + 0.01)
    return worker, Lineup.of(worker, [behind], (), laxity=True), chunk


def test_a_lineup_refuses_without_a_walk_a_prompt_that_covers_one_it_refused(monkeypatch):
    worker, lineup, chunk = refusing_lineup()
    refused = Pending().plus(make_request(1, prompt=2000), worker)
    assert not lineup.keeps_promises(chunk, 0.0, refused, ahead=0)
    walked = []
    monkeypatch.setattr(Chunk, "finish", lambda *args: walked.append(args) or 0.0)
    larger = Pending().plus(make_request(2, prompt=2500), worker)
    assert lineup.refused(chunk, 0.0, larger, ahead=0)
    assert not lineup.keeps_promises(chunk, 0.0, larger, ahead=0) and not walked
    smaller = Pending().plus(make_request(3, prompt=1000), worker)
    assert not lineup.refused(chunk, 0.0, smaller, ahead=0)
    assert not lineup.refused(chunk, 0.0, larger, ahead=1)   # behind the prompt it would have cost


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.05, 3.0), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(1, 6000), st.floats(0.05, 3.0)), min_size=1, max_size=12))
def test_kept_refusals_never_change_an_answer(slos: list[float], candidates: list[tuple[int, float]]):
    worker = make_worker(Role.MULTIPLEX, RULES)
    chunk = Chunk.of(worker, BatchShape.decode(4, 4000), limit=0.1)
    queue = [make_request(i, prompt=1000 + 700 * i, ttft=slo) for i, slo in enumerate(slos)]
    kept = Lineup.of(worker, queue, (), laxity=True)
    for n, (prompt, ttft) in enumerate(candidates):
        candidate = make_request(100 + n, prompt=prompt, ttft=ttft)
        own, ahead = Pending().plus(candidate, worker), kept.place(candidate)
        fresh = Lineup.of(worker, queue, (), laxity=True)
        assert kept.keeps_promises(chunk, 0.0, own, ahead) is fresh.keeps_promises(chunk, 0.0, own, ahead)
