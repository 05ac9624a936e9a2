"""The admission stage: what early rejection and its predictive form refuse, and when."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.factories import make_request, make_worker, start_decoding
from tropical.config import SimConfig
from tropical.core.request import PrefillPath, Request
from tropical.core.slo import SLO
from tropical.sched.assignment import Assignment
from tropical.sched.baselines import ColocatedPolicy, DisaggPolicy
from tropical.sched.cluster import Assigned, Cluster, Fail
from tropical.sched.path2_floors import chunked_floors
from tropical.sched.policy import Policy
from tropical.sched.registry import PolicyParams, make_policy
from tropical.sched.rejection import (
    DECODE_LOAD,
    TTFT,
    TTFT_QUEUED,
    Admission,
    AdmissionMode,
)
from tropical.sched.rules import Role

KV = 1_000_000
EARLY, PREDICTIVE = Admission(AdmissionMode.EARLY_REJECT), Admission(AdmissionMode.PREDICTIVE)


def colocated(admission: Admission, workers: int = 1) -> Cluster:
    policy = ColocatedPolicy(4096)
    policy.admission = admission
    rules = policy.rules(Role.COLOCATED)
    return Cluster([make_worker(Role.COLOCATED, rules, KV, wid=i) for i in range(workers)], policy)


def disagg(admission: Admission) -> Cluster:
    """One prefill worker (0) and one decode worker (1)."""
    policy = DisaggPolicy(4096, num_prefill=1)
    policy.admission = admission
    return Cluster([make_worker(Role.PREFILL, policy.rules(Role.PREFILL), wid=0),
                    make_worker(Role.DECODE, policy.rules(Role.DECODE), KV, wid=1)], policy)


def test_make_policy_gives_every_policy_the_run_s_admission_stage():
    for name in ("colocated", "chunked-512", "disagg", "kv-router", "tropical", "tropical+"):
        assert make_policy(name).admission == Admission()
        params = PolicyParams(admission=AdmissionMode.PREDICTIVE)
        assert make_policy(name, params).admission == PREDICTIVE
    with pytest.raises(ValueError, match="unknown admission mode 'reject'; choose from none, early-reject"):
        SimConfig(admission="reject").policy_params()


def test_without_admission_a_hopeless_request_is_placed_as_before():
    cluster = colocated(Admission())
    hopeless = make_request(0, prompt=100, ttft=0.001)
    assert cluster.arrive(hopeless, 0.0)[0] == Assigned(hopeless, 0)
    assert Admission().lapsed(cluster.workers[0], 5.0) == []


def test_a_hopeless_request_is_refused_at_arrival_before_it_holds_anything():
    """Its prefill alone (10 ms + 0.1 ms x 100 tokens) takes longer than its 5 ms TTFT SLO."""
    cluster = colocated(EARLY)
    hopeless = make_request(0, prompt=100, ttft=0.005)
    [fail] = cluster.arrive(hopeless, 0.0)
    assert isinstance(fail, Fail) and fail.refusal is not None and fail.refusal.reason == TTFT
    assert hopeless.rejected == TTFT and "exceeds the TTFT SLO" in fail.reason
    worker = cluster.workers[0]
    assert not worker.waiting and worker.kv.used_blocks == 0 and cluster.where(0) is None


def test_a_request_is_admitted_while_some_worker_can_meet_its_ttft():
    """Worker 0's queue makes it late there; worker 1 is idle, so a path exists."""
    cluster = colocated(EARLY, workers=2)
    for i in range(3):
        cluster.workers[0].enqueue(make_request(10 + i, prompt=3000, ttft=100.0))
    req = make_request(0, prompt=100, ttft=0.1)
    assert isinstance(cluster.arrive(req, 0.0)[0], Assigned)
    late = make_request(1, prompt=100, ttft=0.1)
    cluster.workers[1].enqueue(make_request(20, prompt=3000, ttft=100.0))
    assert cluster.arrive(late, 0.0)[0].refusal.reason == TTFT


def test_a_request_late_on_every_path_now_is_admitted_while_a_later_decision_may_meet_its_ttft():
    """Both workers' queues make it late now; the policy's floor on a later decision's first
    token (a toggle's round that moves it to a multiplexing worker) decides, asked only then."""
    cluster = colocated(EARLY, workers=2)
    for worker in cluster.workers:
        worker.enqueue(make_request(10 + worker.id, prompt=3000, ttft=100.0))
    req = make_request(0, prompt=100, ttft=0.1)
    placed = Assignment(req, 0, PrefillPath.FALLBACK, "late on Path 1", first_token=0.5)
    asked = []

    def later(at: float):
        return lambda r, now, workers: asked.append(r) or at

    assert EARLY.at_arrival(req, placed, 0.0, cluster.workers, later(0.09)) is None
    assert EARLY.at_arrival(req, placed, 0.0, cluster.workers, later(0.11)).reason == TTFT
    assert EARLY.at_arrival(req, placed, 0.0, cluster.workers).reason == TTFT
    in_time = replace(placed, first_token=0.05)
    assert EARLY.at_arrival(req, in_time, 0.0, cluster.workers, later(math.inf)) is None
    assert asked == [req, req]


def test_only_chunked_multiplexing_offers_a_floor_on_a_later_round_and_it_is_path_2_s_least():
    """``tropical+``'s floor is the least ``chunked_floors`` over its multiplexing workers; the
    paper's toggle (a whole prompt in one iteration) and the baselines offer none."""
    plus, paper = make_policy("tropical+"), make_policy("tropical")
    workers = [make_worker(role, plus.rules(role), KV, wid=i)
               for i, role in enumerate(plus.roles(4))]
    multiplex = [w for w in workers if w.role is Role.MULTIPLEX]
    start_decoding(multiplex[0], make_request(100, prompt=2000, output=50, tpot=0.5))
    req = make_request(0, prompt=500, ttft=1.0, tpot=0.5)
    floor = chunked_floors(req, multiplex, 0.0)
    assert plus.rescue_floor(req, 0.0, workers) == min(floor(w) for w in multiplex)
    assert plus.rescue_floor(req, 0.0, workers) < math.inf
    assert paper.rescue_floor(req, 0.0, workers) == math.inf
    assert make_policy("kv-router").rescue_floor(req, 0.0, workers) == math.inf


def test_the_retry_hint_is_the_predicted_backlog():
    cluster = colocated(EARLY)
    worker = cluster.workers[0]
    worker.enqueue(make_request(10, prompt=1000, ttft=100.0))
    cluster.expect_end(0, 0.5)
    [fail] = cluster.arrive(make_request(0, prompt=100, ttft=0.2), 0.0)
    assert fail.refusal.retry_after == pytest.approx(0.5 + worker.prefill_cost(worker.waiting[0]))


def test_a_queued_prompt_is_refused_once_its_ttft_lapses_and_nothing_was_computed():
    """B was admitted behind A's predicted 0.11 s; A ran until 0.6 s, past B's 0.5 s TTFT SLO."""
    cluster = disagg(EARLY)
    a, b = make_request(0, prompt=1000, ttft=10.0), make_request(1, prompt=100, ttft=0.5)
    cluster.arrive(a, 0.0)
    batch = cluster.plan(0, 0.0)
    cluster.expect_end(0, 0.11)
    assert isinstance(cluster.arrive(b, 0.0)[0], Assigned)
    effects = cluster.book(0, batch, 0.6).effects
    [fail] = [e for e in effects if isinstance(e, Fail)]
    assert fail.request is b and fail.refusal.reason == TTFT_QUEUED and b.rejected == TTFT_QUEUED
    prefill = cluster.workers[0]
    assert b not in prefill.waiting and prefill.waiting_prompt == 0 and cluster.where(1) is None
    assert b.first_token is None and b.computed == 0 and b.id not in prefill.holds


def test_a_prompt_with_computed_tokens_is_never_refused_while_queued():
    worker = make_worker(Role.PREFILL)
    started, fresh = make_request(0, prompt=2000, ttft=0.1), make_request(1, prompt=100, ttft=0.1)
    worker.enqueue(started)
    worker.enqueue(fresh)
    started.computed = 1000
    [(refused, refusal)] = EARLY.lapsed(worker, 5.0)
    assert refused is fresh and refusal.reason == TTFT_QUEUED


def test_the_prompts_ahead_that_stay_set_a_queued_prompt_s_predicted_ttft():
    """The first prompt lapses and leaves; the second then fits behind the current iteration."""
    worker = make_worker(Role.PREFILL)
    worker.enqueue(make_request(0, prompt=2000, ttft=0.1))
    worker.enqueue(make_request(1, prompt=100, ttft=0.1))
    assert [r.id for r, _ in EARLY.lapsed(worker, 0.0)] == [0]


def loaded(policy_admission: Admission, running: int, output: int) -> Cluster:
    """A colocated worker decoding ``running`` requests of 2,000-token prompts, each with
    ``output`` tokens to make: a decode iteration takes 5 ms + 0.1 ms per request + 1 us per
    token of context."""
    cluster = colocated(policy_admission)
    for i in range(running):
        start_decoding(cluster.workers[0], make_request(100 + i, prompt=2000, output=output, tpot=10.0))
    return cluster


def test_predictive_refuses_when_the_decode_load_at_the_prefill_s_end_breaks_tpot():
    """200 long decodes of 2,000-token contexts: each iteration 0.43 s against a 0.1 s TPOT SLO."""
    req = make_request(0, prompt=100, ttft=10.0, tpot=0.1)
    [fail] = loaded(PREDICTIVE, 200, 1000).arrive(req, 0.0)
    assert fail.refusal.reason == DECODE_LOAD and req.rejected == DECODE_LOAD
    assert isinstance(loaded(EARLY, 200, 1000).arrive(make_request(0, prompt=100, ttft=10.0), 0.0)[0],
                      Assigned)


def test_predictive_counts_only_the_decodes_still_running_when_the_prefill_ends():
    """The same batch one token from done, on a decode worker: by the time a 5,000-token
    prompt is through on the prefill worker (0.51 s), it has finished."""
    cluster = disagg(PREDICTIVE)
    for i in range(200):
        start_decoding(cluster.workers[1], make_request(100 + i, prompt=2000, output=2, tpot=10.0))
    req = make_request(0, prompt=5000, ttft=10.0, tpot=0.1)
    assert isinstance(cluster.arrive(req, 0.0)[0], Assigned)


def test_predictive_keeps_the_tpot_of_the_requests_already_decoding():
    """A request with a loose TPOT SLO is refused where it would break a tighter one's."""
    cluster = loaded(PREDICTIVE, 10, 1000)
    start_decoding(cluster.workers[0], make_request(99, prompt=100, output=1000, tpot=0.02))
    [fail] = cluster.arrive(make_request(0, prompt=100, ttft=10.0, tpot=10.0), 0.0)
    assert fail.refusal.reason == DECODE_LOAD and "TPOT SLO 0.02s" in fail.reason


def test_a_prefill_worker_s_request_is_judged_by_the_decoders_it_could_join():
    cluster = disagg(PREDICTIVE)
    for i in range(200):
        start_decoding(cluster.workers[1], make_request(100 + i, prompt=2000, output=1000, tpot=10.0))
    [fail] = cluster.arrive(make_request(0, prompt=100, ttft=10.0, tpot=0.1), 0.0)
    assert fail.refusal.reason == DECODE_LOAD and "worker 1" in fail.reason


def test_every_policy_defaults_to_admitting_everything():
    assert Policy.admission == Admission() and not Admission().active


def chunked_worker_decoding(share: float) -> Cluster:
    """A chunked worker (2,048-token budget) decoding 10 requests of 1,100 tokens at their
    longest, ``share`` of its recent iterations chunked. With a 100-token request joining, a
    decode iteration takes 17.3 ms and one that fills the budget with a chunk 269.5 ms."""
    policy = ColocatedPolicy(4096, chunked=True)
    policy.admission = PREDICTIVE
    worker = make_worker(Role.COLOCATED, policy.rules(Role.COLOCATED), KV)
    for i in range(10):
        start_decoding(worker, make_request(100 + i, prompt=100, output=1000, tpot=10.0))
    worker.chunk_share = share
    return Cluster([worker], policy)


def arriving(tpot: float, tbt: float = math.inf, rid: int = 0) -> Request:
    """A 100-token prompt with as many to answer; time to wait for its first token."""
    return Request(rid, 0.0, 100, 100, SLO(100.0, tpot, tbt))


@pytest.mark.parametrize(("share", "admitted"), [(0.0, True), (0.25, True), (0.4, False), (1.0, False)])
def test_a_chunked_worker_s_decode_is_priced_at_the_share_of_its_iterations_that_carry_a_chunk(
        share, admitted):
    """Against a 0.1 s TPOT SLO: a chunk in every iteration breaks it, and so does one in 40% of
    them (mean 118 ms), but not one in a quarter of them (80 ms): a TPOT SLO bounds the mean."""
    placed = chunked_worker_decoding(share).arrive(arriving(0.1), 0.0)[0]
    assert isinstance(placed, Assigned) is admitted
    if not admitted:
        assert placed.refusal.reason == DECODE_LOAD and "mean decode iteration" in placed.reason


def test_the_prompts_queued_on_a_chunked_worker_add_their_chunks_to_its_recent_share():
    """A 40,720-token prompt queued: its 20 chunks over a 100-token answer put a chunk in a
    fifth of its iterations (mean 274 ms against a 0.3 s TPOT SLO, where one that fills the
    budget takes 1.14 s); with a fifth of the recent iterations chunked too, in 40% (489 ms)."""
    for share, admitted in ((0.0, True), (0.2, False)):
        cluster = chunked_worker_decoding(share)
        cluster.workers[0].enqueue(make_request(50, prompt=2036 * 20, output=1, ttft=1e6))
        placed = cluster.arrive(arriving(0.3), 0.0)[0]
        assert isinstance(placed, Assigned) is admitted


def test_one_chunked_iteration_longer_than_the_tbt_slo_refuses_however_rare():
    placed = chunked_worker_decoding(0.01).arrive(arriving(0.1, tbt=0.2), 0.0)[0]
    assert isinstance(placed, Fail) and "TBT SLO 0.2s" in placed.reason
    assert isinstance(chunked_worker_decoding(0.01).arrive(arriving(0.1, tbt=0.3), 0.0)[0], Assigned)
